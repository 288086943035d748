"""`dwb app` as users start it, called through gradio_client: bit-exact images, PNG parameters, compare,
bad input, the queue's limit, stopping, and what Gradio's file route will and will not serve."""
import time

import httpx
import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, StableDiffusionPipeline
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError, Status
from PIL import Image

from models.checkpoints import content_hash, find_checkpoint
from models.generation.png import parse_parameters


def call(client, tree, api_name="/generate", **kw):
    args = dict(checkpoint=str(tree.ba4), weights="ema", prompt="two blue squares", negative_prompt="",
                sampler="DPM++ 2M", steps=6, guidance_scale=5.0, width=16, height=16, seed=7, batch_size=1)
    if api_name == "/compare":
        args.pop("checkpoint")
        args.pop("batch_size")
    return client.predict(**{**args, **kw}, api_name=api_name)


def read(item) -> tuple[np.ndarray, dict, str]:
    with Image.open(item["image"]) as im:
        return np.asarray(im.convert("RGB")), dict(im.text), im.format


def reference(pipe, seeds, scheduler=None, **kw) -> list[np.ndarray]:
    """The same images straight from models.checkpoints.load_pipeline's pipeline, through diffusers' own API."""
    if scheduler is not None:
        pipe = StableDiffusionPipeline(**{**pipe.components, "scheduler": scheduler}, requires_safety_checker=False)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    n = len(seeds)
    neg = kw.pop("negative_prompt", None)
    out = pipe([kw.pop("prompt")] * n, negative_prompt=[neg] * n if neg else None, generator=gens, output_type="pil",
               **kw).images
    return [np.asarray(i) for i in out]


def test_api_images_equal_load_pipeline_bit_for_bit_and_carry_their_parameters(client, tree, pipe):
    gallery, text = call(client, tree, prompt="two red circles", negative_prompt="blue", steps=8, seed=7,
                         batch_size=2)
    ref = reference(pipe, [7, 8], prompt="two red circles", negative_prompt="blue", num_inference_steps=8,
                    guidance_scale=5.0, width=16, height=16)
    digest = content_hash(find_checkpoint(tree.ba4))
    assert len(gallery) == 2
    for i, item in enumerate(gallery):
        pixels, chunks, fmt = read(item)
        assert fmt == "PNG" and pixels.shape == (16, 16, 3)
        assert np.array_equal(pixels, ref[i])  # bit for bit
        assert item["caption"] == f"seed {7 + i}"
        p = parse_parameters(chunks["parameters"])
        assert (p["prompt"], p["negative_prompt"], p["Seed"], p["Steps"], p["Sampler"]) == (
            "two red circles", "blue", str(7 + i), "8", "DPM++ 2M")  # the pipeline's own sampler
        assert (p["CFG scale"], p["Size"], p["Model hash"], p["Weights"]) == ("5", "16x16", digest, "EMA")
        assert p["Model"] == "tiny-phase1/ep0-ba4-rank0.pt" and digest in chunks["dwb"]
    assert text == read(gallery[0])[1]["parameters"]

    # another sampler and a non-square size: still the image diffusers gives
    gallery, _ = call(client, tree, sampler="DPM++ 2M Karras", width=24, height=16, seed=123)
    karras = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True)
    ref = reference(pipe, [123], scheduler=karras, prompt="two blue squares", num_inference_steps=6,
                    guidance_scale=5.0, width=24, height=16)
    assert np.array_equal(read(gallery[0])[0], ref[0])


def test_diffusers_folder_ema_and_raw_weights(client, tree):
    ema = read(call(client, tree, seed=11)[0][0])[0]
    exported, chunks, _ = read(call(client, tree, checkpoint="export-ba4", seed=11)[0][0])
    raw = read(call(client, tree, weights="raw", seed=11)[0][0])[0]
    assert np.array_equal(exported, ema)  # the folder holds ba4's EMA weights
    assert not np.array_equal(raw, ema)
    p = parse_parameters(chunks["parameters"])
    assert p["Weights"] == "stored" and p["Model"] == "export-ba4"
    assert p["Model hash"] == content_hash(find_checkpoint(tree.export))


def test_compare_puts_checkpoints_side_by_side_with_one_seed(client, tree):
    names = [str(tree.ba2), str(tree.ba4), "export-ba4"]
    gallery, pair, text = call(client, tree, "/compare", checkpoints=names, seed=5, sampler="Euler a")
    assert len(gallery) == 3
    for name, label, item in zip(names, ["tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt", "export-ba4"],
                                 gallery):
        assert item["caption"] == f"{label} ({'stored' if label == 'export-ba4' else 'ema'})"
        alone = call(client, tree, checkpoint=name, seed=5, sampler="Euler a")[0][0]
        assert np.array_equal(read(item)[0], read(alone)[0])  # each is that checkpoint's own image
        assert parse_parameters(read(item)[1]["parameters"])["Model"] == label
    assert not np.array_equal(read(gallery[0])[0], read(gallery[1])[0])  # training changed something
    assert "Seed: 5" in text
    for item, side in zip(gallery[:2], pair):  # the A/B slider holds the first two images
        assert np.array_equal(read(item)[0], np.asarray(Image.open(side).convert("RGB")))


BAD = {
    "steps 0": (dict(steps=0), "steps must be between 1 and 150, got 0"),
    "steps over the limit": (dict(steps=151), "steps must be between 1 and 150, got 151"),
    "size not a multiple of 8": (dict(width=20), "width must be a multiple of 8, got 20"),
    "size too large": (dict(height=2048), "height must be between 16 and 1024, got 2048"),
    "unknown sampler": (dict(sampler="Karras 9000"), "unknown sampler 'Karras 9000'"),
    "empty prompt": (dict(prompt=""), "the prompt is empty"),
    "path outside the roots": (dict(checkpoint="OUTSIDE"), "is outside the allowed checkpoint folders"),
    "relative escape": (dict(checkpoint="../outside/ep0-ba4-rank0.pt"), "is outside the allowed checkpoint folders"),
    "symlink out of the roots": (dict(checkpoint="LINKED"), "is outside the allowed checkpoint folders"),
    "pipeline linking out": (dict(checkpoint="SNEAKY"), "outside the allowed checkpoint folders"),
    "corrupt checkpoint": (dict(checkpoint="broken/ep0-ba9-rank0.pt"),
                           "cannot read checkpoint broken/ep0-ba9-rank0.pt: corrupt, not a PyTorch file"),
    "foreign checkpoint": (dict(checkpoint="foreign/ep0-ba1-rank0.pt"),
                           "foreign/ep0-ba1-rank0.pt is not a Composer checkpoint"),
    "compare with one checkpoint": (dict(api_name="/compare", checkpoints=["export-ba4"]),
                                    "choose two to four checkpoints to compare, got 1"),
}


def test_bad_input_gets_a_clear_message_and_the_server_keeps_serving(client, tree, server):
    paths = {"OUTSIDE": str(tree.outside / "ep0-ba4-rank0.pt"), "LINKED": str(tree.linked), "SNEAKY": str(tree.sneaky)}
    for case, (change, message) in BAD.items():
        change = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in change.items()}
        with pytest.raises(AppError) as e:
            call(client, tree, **change)
        shown = str(e.value)
        assert message in shown and "Traceback" not in shown and "\n" not in shown, case
    assert server.proc.poll() is None
    gallery, _ = call(client, tree, steps=2)  # and the next good request is served
    assert read(gallery[0])[0].shape == (16, 16, 3)


def _wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def press_stop(client) -> None:
    """What the page's Stop button sends: a direct POST for the client's session, outside the queue's event
    stream (``client.submit(api_name="/stop")`` would share that stream with the running generation, and
    under load the stream was seen to end with ``session_not_found`` before the stopped job's result came)."""
    r = httpx.post(f"{client.src_prefixed}run/stop", json={"data": [], "session_hash": client.session_hash})
    assert r.status_code == 200, r.text


def test_stop_ends_a_running_generation_early(client, tree):
    job = client.submit(str(tree.ba4), "ema", "a red circle", "", "DDIM", 150, 5.0, 64, 64, 1, 1, api_name="/generate")
    _wait_until(lambda: (s := job.status()).code == Status.PROGRESS and s.progress_data
                and s.progress_data[0].index and s.progress_data[0].index >= 1)
    press_stop(client)
    with pytest.raises(AppError, match=r"stopped after (\d+) of 150 steps") as e:
        job.result(timeout=60)
    assert int(str(e.value).split("after ")[1].split(" ")[0]) < 150
    assert read(call(client, tree, steps=2)[0][0])[0].shape == (16, 16, 3)  # the next request runs normally


def test_queue_refuses_requests_beyond_its_size(server, tree):
    """--queue-size 2: with one generation running and two waiting, more are refused at once."""
    from gradio_client import Client

    clients = [Client(server.url, verbose=False, download_files=False) for _ in range(5)]
    slow = (str(tree.ba4), "ema", "a red circle", "", "DDIM", 150, 5.0, 64, 64, 1, 1)
    jobs = [c.submit(*slow, api_name="/generate") for c in clients]
    _wait_until(lambda: sum(j.done() for j in jobs) >= 1)
    refused = []
    for j in jobs:
        if j.done():
            with pytest.raises(QueueError, match="Queue is full"):
                j.result()
            refused.append(j)
    assert 1 <= len(refused) <= 3
    deadline = time.monotonic() + 60
    while not all(j.done() for j in jobs):  # end the accepted ones: waiting ones leave the queue, running ones stop
        assert time.monotonic() < deadline, "accepted requests did not end"
        for c, j in zip(clients, jobs):
            if not j.done():
                j.cancel()
                press_stop(c)
        time.sleep(0.2)


def test_gradio_serves_generated_images_but_not_the_checkpoint_folders(server, tree, tmp_path):
    from gradio_client import Client

    client = Client(server.url, verbose=False, download_files=False)
    gallery, _ = call(client, tree, steps=2)
    url = gallery[0]["image"]["url"]
    ok = httpx.get(url, timeout=10)
    assert ok.status_code == 200 and ok.content.startswith(b"\x89PNG")
    for path in (tree.ba4, tree.export / "model_index.json", tree.outside / "ep0-ba4-rank0.pt", "/etc/passwd"):
        r = httpx.get(f"{server.url}/gradio_api/file={path}", timeout=10)
        assert r.status_code == 403, path
