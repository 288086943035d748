"""ControlNet through the one generation path: tiny random ControlNets written by diffusers' ``save_pretrained`` (made by
``ControlNetModel.from_unet`` from the reduced SD 2 UNet and the tiny SDXL one, every weight perturbed so the control
shows) open through the door as a folder, a single file (diffusers' names, and ControlNet 1.x's original layout) and
a hub id of the cache, and steer the image exactly as diffusers' own ControlNet pipelines do with the same inputs; `dwb sample --controlnet` records the unit as AUTOMATIC1111's ControlNet
extension writes it, and the recorded values draw the same image again; hostile inputs are one line each."""
from __future__ import annotations

import shutil

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from models.checkpoints import load_pipeline, open_controlnet
from models.errors import WorkbenchError
from models.generation import Control, ImageRecord, Settings, control_of, generate_images, parse_parameters
from models.generation.samplers import make_sampler

from .checkpoints.fixtures import reduced_pipeline

PROMPT, SEEDS, STEPS, SIDE = "a red circle above a blue square", [5, 6], 3, 32
WEIGHTS = "diffusion_pytorch_model.safetensors"


def write_controlnet(unet, out, widths: tuple[int, ...], seed: int = 1):
    """A ControlNet of ``unet`` (its control image embedding halving ``len(widths) - 1`` times, as its VAE does),
    every weight perturbed (``from_unet`` leaves its zero convolutions at zero, which would steer nothing), saved by
    diffusers."""
    torch.manual_seed(seed)
    controlnet = diffusers.ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=widths)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in controlnet.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    controlnet.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def made(family_folders, tmp_path_factory) -> dict:
    """{family: (our pipeline through the door, diffusers' own of the same weights, its ControlNet folder)}."""
    root = tmp_path_factory.mktemp("controlnets")
    sd2 = reduced_pipeline("sd2", seed=2)
    sdxl_folder = family_folders["sdxl"]
    sdxl, sdxl_reference = load_pipeline(str(sdxl_folder)), diffusers.DiffusionPipeline.from_pretrained(sdxl_folder)
    return {"sd2": (sd2, sd2, write_controlnet(sd2.unet, root / "sd2-canny", (16, 32, 64))),
            "sdxl": (sdxl, sdxl_reference, write_controlnet(sdxl.unet, root / "sdxl-canny", (16, 32)))}


@pytest.fixture(scope="module")
def upload() -> Image.Image:
    """An image with edges in it (squares on a gradient), of another size than the drawn one."""
    pixels = np.tile(np.linspace(0, 255, 40, dtype=np.uint8)[None, :, None], (48, 1, 3))
    pixels[8:24, 6:20] = (250, 20, 20)
    pixels[28:44, 22:36] = (20, 20, 250)
    return Image.fromarray(pixels)


def canny_by_opencv(image: Image.Image) -> Image.Image:
    import cv2

    edges = cv2.Canny(np.asarray(image), 100, 200)
    return Image.fromarray(np.stack([edges] * 3, axis=-1))


def generators() -> list[torch.Generator]:
    return [torch.Generator("cpu").manual_seed(s) for s in SEEDS]


@pytest.mark.parametrize("name", ["sd2", "sdxl"])
def test_a_controlnet_steers_as_diffusers_controlnet_pipeline_does_from_a_folder_and_a_single_file(
        name, made, upload, tmp_path):
    from models.families import family_of_pipeline

    ours, reference, folder = made[name]
    opened = open_controlnet(str(folder), ours)
    settings = Settings(steps=STEPS, guidance=3.0, width=SIDE, height=SIDE, sampler="Euler",
                        control=Control(opened.model, opened.name, opened.hash, upload, "canny", 0.8, 0.1, 0.9))
    drawn = generate_images(ours, [PROMPT] * 2, SEEDS, settings)

    plain = getattr(diffusers, family_of_pipeline(ours).controlnet_pipeline).from_pipe(
        reference, controlnet=diffusers.ControlNetModel.from_pretrained(folder))
    plain.scheduler = make_sampler("Euler", reference.scheduler.config)
    plain.set_progress_bar_config(disable=True)
    expected = plain([PROMPT] * 2, image=canny_by_opencv(upload), controlnet_conditioning_scale=0.8,
                     control_guidance_start=0.1, control_guidance_end=0.9, num_inference_steps=STEPS,
                     guidance_scale=3.0, width=SIDE, height=SIDE, output_type="np", generator=generators()).images
    assert np.array_equal(drawn, (expected * 255).round().astype(np.uint8))
    if name == "sd2":  # the perturbed ControlNets steer (one family shows it): not text to image under another name
        unsteered = generate_images(ours, [PROMPT] * 2, SEEDS, Settings(steps=STEPS, guidance=3.0, width=SIDE,
                                                                        height=SIDE, sampler="Euler"))
        assert not np.array_equal(drawn, unsteered)

    single = tmp_path / f"{name}-canny.safetensors"  # the weights alone, as AUTOMATIC1111's folders hold them
    shutil.copyfile(folder / WEIGHTS, single)
    alone = open_controlnet(str(single), ours)  # its config made from the UNet's and its own tensors' sizes
    mine, theirs = alone.model.state_dict(), opened.model.state_dict()
    assert alone.name == f"{name}-canny" and mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def original_layout(controlnet, unet_config: dict) -> dict:
    """A diffusers ControlNet's weights under ControlNet 1.x's original names (``control_model.``), as its
    published safetensors files hold them: the UNet's names from the export room's map of the original UNet, and
    the control embedding's, zero convolutions' and middle block's own."""
    from models.export.original_layout import UNET_RESNET, _block_prefixes, _renamed, unet_prefixes

    resnets, other = unet_prefixes(unet_config)
    blocks = len(controlnet.controlnet_cond_embedding.blocks)
    own = [("controlnet_cond_embedding.conv_in.", "input_hint_block.0."),
           *[(f"controlnet_cond_embedding.blocks.{i}.", f"input_hint_block.{2 * i + 2}.") for i in range(blocks)],
           ("controlnet_cond_embedding.conv_out.", f"input_hint_block.{2 * blocks + 2}."),
           *[(f"controlnet_down_blocks.{i}.", f"zero_convs.{i}.0.") for i in range(len(controlnet.controlnet_down_blocks))],
           ("controlnet_mid_block.", "middle_block_out.0.")]
    out = {}
    for key, tensor in controlnet.state_dict().items():
        if (pair := _block_prefixes(own, key) or _block_prefixes(other, key)) is not None:
            out["control_model." + pair[1] + key[len(pair[0]):]] = tensor
        else:
            pair = _block_prefixes(resnets, key)
            out["control_model." + pair[1] + _renamed(key[len(pair[0]):], UNET_RESNET)] = tensor
    return out


def test_a_controlnet_in_the_original_layout_opens_as_its_diffusers_folder(made, tmp_path):
    from diffusers import AutoencoderKL, StableDiffusionPipeline
    from safetensors.torch import save_file

    sd2 = made["sd2"][0]
    # ControlNet 1.x's control embedding makes the image 8 times smaller: a pipeline whose VAE does too
    vae = AutoencoderKL(block_out_channels=(32,) * 4, layers_per_block=1, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
    pipe = StableDiffusionPipeline(**{**sd2.components, "vae": vae})
    folder = write_controlnet(pipe.unet, tmp_path / "sd15-canny", (16, 32, 96, 256))
    published = diffusers.ControlNetModel.from_pretrained(folder)
    save_file(original_layout(published, dict(pipe.unet.config)), tmp_path / "control_sd15_canny.safetensors")
    alone, by_folder = open_controlnet(str(tmp_path / "control_sd15_canny.safetensors"), pipe), \
        open_controlnet(str(folder), pipe)
    mine, theirs = alone.model.state_dict(), by_folder.model.state_dict()
    assert alone.name == "control_sd15_canny" and mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    short = {k: v for k, v in original_layout(published, dict(pipe.unet.config)).items()
             if not k.startswith("control_model.input_hint_block.14.")}
    save_file(short, tmp_path / "odd.safetensors")
    one_line(lambda: open_controlnet(str(tmp_path / "odd.safetensors"), pipe), "no input_hint_block.14")


def test_a_hub_id_opens_the_controlnet_its_cached_snapshot_holds(made, tmp_path, monkeypatch):
    from .checkpoints.fixtures import commit_hash, write_hub_snapshot

    sd2, _, folder = made["sd2"]
    write_hub_snapshot(tmp_path / "hub", "dwb-test/sd2-canny", folder, commit_hash("sd2-canny"), refs=("main",))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    by_id, by_folder = open_controlnet("dwb-test/sd2-canny", sd2), open_controlnet(str(folder), sd2)
    assert by_id.name == "dwb-test/sd2-canny" and by_id.hash == by_folder.hash
    mine, theirs = by_id.model.state_dict(), by_folder.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    one_line(lambda: open_controlnet("dwb-test/absent", sd2), "ControlNet dwb-test/absent is not in the Hugging "
             "Face cache")
    with pytest.raises(WorkbenchError) as caught:  # a server's client: the cache's path is not said
        open_controlnet("dwb-test/absent", sd2, roots=[tmp_path / "folders"])
    assert str(caught.value) == ("ControlNet not found: dwb-test/absent (not under the allowed folders, nor in the "
                                 "server's Hugging Face cache)")


def test_dwb_sample_records_the_unit_as_a1111_writes_it_and_the_record_draws_the_same_image(
        dwb, made, upload, family_folders, tmp_path):
    upload.save(tmp_path / "pose.png")
    folder = made["sdxl"][2]
    run = dwb("sample", str(family_folders["sdxl"]), str(tmp_path / "out.png"), "--prompt", PROMPT, "--seed", "5",
              "--seeds", "1", "--steps", "3", "--sampler", "Euler", "--size", "32", "--controlnet", str(folder),
              "--control-image", str(tmp_path / "pose.png"), "--control-preprocess", "canny",
              "--control-strength", "0.7", "--control-end", "0.8", "--per-image")
    assert run.returncode == 0, run.stderr
    assert "steered by ControlNet sdxl-canny" in run.stdout
    written = Image.open(tmp_path / "out" / "00000-5.png")
    text = written.info["parameters"]
    opened = open_controlnet(str(folder), made["sdxl"][0])
    assert (f'ControlNet 0: "Module: canny, Model: sdxl-canny [{opened.hash}], Weight: 0.7, Resize Mode: Just Resize, '
            'Threshold A: 100, Threshold B: 200, Guidance Start: 0, Guidance End: 0.8, Control Mode: Balanced"') in text
    parsed = parse_parameters(text)
    unit = control_of(parsed)
    assert (unit["module"], unit["model"], unit["hash"]) == ("canny", "sdxl-canny", opened.hash)
    restored = Control(opened.model, unit["model"], unit["hash"], upload, unit["module"], float(unit["weight"]),
                       float(unit["start"]), float(unit["end"]), (int(unit["low"]), int(unit["high"])))
    again = generate_images(made["sdxl"][0], [PROMPT], [5], Settings(
        steps=int(parsed["Steps"]), guidance=float(parsed["CFG scale"]), width=SIDE, height=SIDE,
        sampler=parsed["Sampler"], control=restored))
    assert np.array_equal(np.asarray(written.convert("RGB")), again[0])


def test_a_record_without_a_controlnet_writes_no_unit_and_reads_none():
    record = ImageRecord(PROMPT, "", "Euler", 4, 3.0, 32, 32, 5, "tiny", "abc", "stored")
    assert "ControlNet" not in record.parameters() and control_of(parse_parameters(record.parameters())) is None
    a1111 = ('a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 512x512, ControlNet 0: "Module: none, '
             'Model: control_v11p_sd15_openpose [cab727d4], Weight: 1.0, Resize Mode: Crop and Resize, Low Vram: '
             'False, Guidance Start: 0.0, Guidance End: 1.0, Pixel Perfect: False, Control Mode: Balanced"')
    assert control_of(parse_parameters(a1111)) == {"module": "none", "weight": "1.0", "start": "0.0", "end": "1.0",
                                                   "model": "control_v11p_sd15_openpose", "hash": "cab727d4"}


def one_line(call, match: str) -> None:
    with pytest.raises(WorkbenchError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_hostile_controlnets_and_control_images_are_one_line(dwb, made, upload, family_folders, tmp_path):
    from safetensors.torch import save_file

    from .test_sample_modes import giant_png

    sd2, _, sd2_folder = made["sd2"]
    sdxl_folder = made["sdxl"][2]
    # a ControlNet of another family: SDXL's text states are wider than SD 2's
    one_line(lambda: open_controlnet(str(sdxl_folder), sd2), "conditions on 80-wide text states; this Stable "
             "Diffusion 2.x model's UNet takes 64-wide ones: a ControlNet of another family")
    pickle = tmp_path / "control_sd15_canny.pth"
    pickle.write_bytes(b"not opened")
    one_line(lambda: open_controlnet(str(pickle), sd2), "is a pickle")
    bomb = tmp_path / "bomb.safetensors"  # a header declaring 10^12 elements in a file of a few bytes
    header = b'{"x": {"dtype": "F32", "shape": [1000000, 1000000], "data_offsets": [0, 4]}}'
    bomb.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    one_line(lambda: open_controlnet(str(bomb), sd2), "ControlNet .*bomb.safetensors")
    extra = tmp_path / "extra"
    shutil.copytree(sd2_folder, extra)
    save_file({"stowaway": torch.zeros(2), **_tensors(sd2_folder / WEIGHTS)}, extra / WEIGHTS)
    one_line(lambda: open_controlnet(str(extra), sd2), "holds stowaway, which the model has not")
    other = tmp_path / "other"
    shutil.copytree(sd2_folder, other)
    (other / "config.json").write_text('{"_class_name": "UNet2DConditionModel"}')
    one_line(lambda: open_controlnet(str(other), sd2), "is of a UNet2DConditionModel, not a ControlNetModel")
    one_line(lambda: open_controlnet(str(sd2_folder), sd2, roots=[tmp_path]), "outside the allowed")
    for kwargs, match in ((dict(weight=3.0), "control strength must be a number from 0 to 2"),
                          (dict(start=0.6, end=0.4), "control start 0.6 must come before control end 0.4"),
                          (dict(module="depth"), "control preprocess 'depth' is not one of")):
        one_line(lambda: Control(None, "n", "h", upload, **kwargs), match)
    (tmp_path / "giant.png").write_bytes(giant_png(100_000, 100_000))
    upload.save(tmp_path / "pose.png")
    for checkpoint, image, match in ((family_folders["sdxl"], "giant.png", "--control-image"),
                                     (family_folders["sd3"], "pose.png", "Stable Diffusion 3.5 has no ControlNet")):
        refused = dwb("sample", str(checkpoint), str(tmp_path / "no.png"), "--controlnet", str(sdxl_folder),
                      "--control-image", str(tmp_path / image))
        assert refused.returncode != 0 and match in refused.stderr.strip().splitlines()[-1]


def _tensors(path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)
