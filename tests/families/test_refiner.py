"""SDXL's refiner as a second stage: a refiner folder (written by diffusers' own save_pretrained) is recognised as
SDXL's refiner variant, finishes a base's latents into the image plain diffusers' two-stage use makes, is refused
in one line where it cannot be used, and is recorded in the PNG parameters as A1111 and Forge write it."""
from __future__ import annotations

import json

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from models.checkpoints import content_hash, find_checkpoint, load_pipeline
from models.checkpoints.open import describe
from models.errors import WorkbenchError
from models.families import family_named, family_of_folder, family_of_pipeline
from models.generation import ImageRecord, Refiner, Settings, generate_images, parse_parameters, refiner_of, sampler_of

from ..conftest import run_dwb
from ..family_fixtures import write_sdxl_refiner

PROMPT, SEED, STEPS, SIDE, SWITCH = "a red circle above a blue square", 7, 4, 32, 0.6
SDXL = family_named("sdxl")


@pytest.fixture(scope="module")
def refiner_folder(tmp_path_factory):
    torch.manual_seed(1)
    root = tmp_path_factory.mktemp("refiner")
    return write_sdxl_refiner(root / "sdxl-refiner", root / "tokenizers")


@pytest.fixture(scope="module")
def pipes(family_folders, refiner_folder):
    return load_pipeline(str(family_folders["sdxl"])), load_pipeline(str(refiner_folder), refiner=True)


def refiner_of_pipe(pipe, folder, switch: float = SWITCH) -> Refiner:
    ckpt = find_checkpoint(str(folder))
    return Refiner(pipe, ckpt.label, content_hash(ckpt), switch)


def plain_two_stage(base_folder, refiner_folder, scheduler: str) -> np.ndarray:
    """Diffusers' published two-stage use: the base to ``denoising_end`` as latents, the refiner from
    ``denoising_start``, both with the same seeded generator and a scheduler of the class ``scheduler``."""
    base = diffusers.StableDiffusionXLPipeline.from_pretrained(base_folder)
    refiner = diffusers.StableDiffusionXLImg2ImgPipeline.from_pretrained(refiner_folder)
    for pipe in (base, refiner):
        pipe.scheduler = getattr(diffusers, scheduler).from_config(pipe.scheduler.config)
        pipe.set_progress_bar_config(disable=True)
    generator = [torch.Generator("cpu").manual_seed(SEED)]
    latents = base(PROMPT, num_inference_steps=STEPS, guidance_scale=4.0, width=SIDE, height=SIDE,
                   denoising_end=SWITCH, output_type="latent", generator=generator).images
    images = refiner(PROMPT, image=latents, num_inference_steps=STEPS, guidance_scale=4.0, denoising_start=SWITCH,
                     output_type="np", generator=generator).images
    return (images * 255).round().astype(np.uint8)


def test_a_refiner_folder_is_sdxls_refiner_variant(refiner_folder, pipes):
    assert family_of_folder(refiner_folder, "r") is SDXL
    assert describe(find_checkpoint(str(refiner_folder))).family == "sdxl"
    refiner = pipes[1]
    assert type(refiner).__name__ == SDXL.refiner_pipeline and refiner.text_encoder is None
    assert family_of_pipeline(refiner) is SDXL and SDXL.variant_of(refiner.unet.config).refiner
    assert not SDXL.variant_of(pipes[0].unet.config).refiner
    # the published configs are told apart by the same rule as the tiny ones
    assert [SDXL.variant_of(v.parts["unet"].config).name for v in SDXL.variants] == ["base", "refiner"]


@pytest.mark.parametrize("sampler,scheduler", [("Euler", "EulerDiscreteScheduler"),
                                               ("Euler a", "EulerAncestralDiscreteScheduler")])
def test_two_stages_draw_what_plain_diffusers_two_stages_draw(sampler, scheduler, family_folders, refiner_folder,
                                                              pipes):
    """The ancestral sampler draws noise at every step of both stages: the refiner goes on with each seed's
    generator where the base left it, as the published use passes one generator to both."""
    base, refiner = pipes
    settings = Settings(steps=STEPS, guidance=4.0, width=SIDE, height=SIDE, sampler=sampler,
                        refiner=refiner_of_pipe(refiner, refiner_folder))
    steps = []
    ours = generate_images(base, [PROMPT], [SEED], settings, on_step=lambda done, total: steps.append((done, total)))
    np.testing.assert_array_equal(ours, plain_two_stage(family_folders["sdxl"], refiner_folder, scheduler))
    assert steps == [(done, STEPS) for done in range(1, STEPS + 1)]  # one count across both stages
    if sampler == "Euler":
        alone = generate_images(base, [PROMPT], [SEED], Settings(steps=STEPS, guidance=4.0, width=SIDE, height=SIDE,
                                                                 sampler=sampler))
        assert np.abs(alone.astype(int) - ours).max() > 0  # the refiner drew the last steps


def test_what_a_refiner_cannot_do_is_one_line(family_folders, refiner_folder, pipes):
    base, refiner = pipes
    with pytest.raises(WorkbenchError, match=r"is a Stable Diffusion XL refiner: it finishes a base model's image "
                                             r"and draws none from text alone; give it as the refiner of a Stable "
                                             r"Diffusion XL base \(dwb sample BASE OUT --refiner ") as alone:
        load_pipeline(str(refiner_folder))
    assert "\n" not in str(alone.value)
    with pytest.raises(WorkbenchError, match=r"is a Stable Diffusion XL \(base\) model, not a refiner"):
        load_pipeline(str(family_folders["sdxl"]), refiner=True)
    for switch in (0, 1, 1.5, -0.2):
        with pytest.raises(WorkbenchError, match="the refiner switch is the fraction of the steps the base takes"):
            Refiner(refiner, "r", "h", switch)
    sd3 = load_pipeline(str(family_folders["sd3"]))
    with pytest.raises(WorkbenchError, match=r"^Stable Diffusion 3.5 has no refiner stage"):
        generate_images(sd3, [PROMPT], [0], Settings(steps=2, width=SIDE, height=SIDE, sampler="Euler",
                                                     refiner=refiner_of_pipe(refiner, refiner_folder)))
    with pytest.raises(WorkbenchError, match=r"is a Stable Diffusion XL \(base\) model, not a refiner"):
        generate_images(base, [PROMPT], [0], Settings(steps=2, width=SIDE, height=SIDE, sampler="Euler",
                                                      refiner=Refiner(base, "base", "h", 0.5)))


def test_dwb_sample_refuses_a_refiner_alone_and_a_switch_outside_0_1_in_one_line(refiner_folder, tmp_path):
    out = tmp_path / "never.png"
    alone = run_dwb("sample", str(refiner_folder), str(out), "--prompt", PROMPT, "--steps", "1", "--size", str(SIDE))
    assert alone.returncode != 0 and not out.exists() and "Traceback" not in alone.stderr
    last = alone.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "refiner" in last and "--refiner" in last
    switch = run_dwb("sample", str(refiner_folder), str(out), "--refiner", str(refiner_folder), "--refiner-switch", "1")
    assert switch.returncode != 0 and "--refiner-switch: 1 is not between 0 and 1" in switch.stderr


def test_dwb_sample_with_a_refiner_records_it_and_png_info_reads_it_back(family_folders, refiner_folder, tmp_path,
                                                                         pipes):
    out = tmp_path / "refined.png"
    run = run_dwb("sample", str(family_folders["sdxl"]), str(out), "--prompt", PROMPT, "--steps", str(STEPS),
                  "--size", str(SIDE), "--seeds", "1", "--seed", str(SEED), "--sampler", "Euler", "--guidance", "4",
                  "--refiner", str(refiner_folder), "--refiner-switch", str(SWITCH), "--per-image")
    assert run.returncode == 0, run.stderr[-2000:]
    refiner = find_checkpoint(str(refiner_folder))
    field = f"Refiner: {refiner.label} [{content_hash(refiner)}], Refiner switch at: {SWITCH:g}"
    with Image.open(out) as grid:
        assert field in grid.text["parameters"]
    with Image.open(next((tmp_path / "refined").glob("*.png"))) as image:
        text, chunk, pixels = image.text["parameters"], image.text["dwb"], np.asarray(image.convert("RGB"))
    assert refiner_of(parse_parameters(text)) == (refiner.label, content_hash(refiner), SWITCH)
    record = ImageRecord.from_chunk(chunk)
    assert (record.refiner, record.refiner_hash, record.refiner_switch) == (refiner.label, content_hash(refiner),
                                                                            SWITCH)
    assert ImageRecord.from_chunk(json.dumps(json.loads(chunk))).parameters() == text
    # the image on disk is the one the same settings draw in process
    again = generate_images(pipes[0], [PROMPT], [SEED], Settings(steps=STEPS, guidance=4.0, width=SIDE, height=SIDE,
                                                                 sampler="Euler",
                                                                 refiner=refiner_of_pipe(pipes[1], refiner_folder)))
    np.testing.assert_array_equal(pixels, again[0])


def test_a_record_without_a_refiner_says_none_and_a1111s_refiner_field_reads_back():
    plain = ImageRecord.of(Settings(steps=3), PROMPT, 1, (64, 64), sampler_of(Settings()), "m", "abc", "stored")
    assert "Refiner" not in plain.parameters() and refiner_of(parse_parameters(plain.parameters())) is None
    a1111 = ("a cat\nSteps: 30, Sampler: DPM++ 2M, CFG scale: 7, Seed: 1, Size: 1024x1024, Model hash: 31e35c80fc, "
             "Model: sd_xl_base_1.0, Refiner: sd_xl_refiner_1.0 [7440042bbd], Refiner switch at: 0.8, Version: v1.6.0")
    assert refiner_of(parse_parameters(a1111)) == ("sd_xl_refiner_1.0", "7440042bbd", 0.8)
    assert refiner_of({"Refiner": "r [h]", "Refiner switch at": "1.5"}) == ("r", "h", None)


def test_the_app_refines_with_a_refiner_under_its_folders_and_refuses_in_one_line(family_folders, refiner_folder,
                                                                                  tmp_path, pipes):
    import shutil

    from app.generate import GenerationParams
    from app.service import Service

    root = tmp_path / "models"
    shutil.copytree(family_folders["sdxl"], root / "sdxl")
    shutil.copytree(refiner_folder, root / "sdxl-refiner")
    service = Service([root], cache_size=2)
    params = GenerationParams(PROMPT, sampler="Euler", steps=STEPS, guidance=4.0, width=SIDE, height=SIDE, seed=SEED,
                              refiner="sdxl-refiner", refiner_switch=SWITCH)
    result = service.generate("sdxl", "auto", params)
    record = result.records[0]
    assert (record.refiner, record.refiner_switch) == ("sdxl-refiner", SWITCH)
    assert f"Refiner: sdxl-refiner [{record.refiner_hash}], Refiner switch at: {SWITCH:g}" in record.parameters()
    drawn = generate_images(pipes[0], [PROMPT], [SEED], Settings(steps=STEPS, guidance=4.0, width=SIDE, height=SIDE,
                                                                 sampler="Euler",
                                                                 refiner=refiner_of_pipe(pipes[1], refiner_folder)))
    np.testing.assert_array_equal(np.asarray(result.images[0].convert("RGB")), drawn[0])
    refusals = {"refiner switch must be between 0 and 1": dict(refiner="sdxl-refiner", refiner_switch=1.0),
                "refiner switch must be a number": dict(refiner="sdxl-refiner", refiner_switch="most"),
                "is a Stable Diffusion XL (base) model, not a refiner": dict(refiner="sdxl"),
                "a checkpoint name of 5,000 characters": dict(refiner="a/" * 2500)}
    for message, change in refusals.items():
        with pytest.raises(WorkbenchError) as refused:
            service.generate("sdxl", "auto", GenerationParams(**{**params.__dict__, **change}))
        assert message in str(refused.value) and "\n" not in str(refused.value)
        assert str(root) not in str(refused.value)
    with pytest.raises(WorkbenchError, match="is a Stable Diffusion XL refiner: it finishes a base model's image"):
        service.generate("sdxl-refiner", "auto", GenerationParams(**{**params.__dict__, "refiner": ""}))

    # PNG Info's Send to Generate fills the refiner and its switch from the image, found by its hash, and empties
    # the field for an image drawn without one (a stale refiner would draw another image)
    from app.handlers import Handlers

    handlers = Handlers(service)
    saved = tmp_path / "refined.png"
    result.images[0].save(saved, pnginfo=_png_text(result.images[0]))
    _, values, _ = handlers.png_info(str(saved))
    assert (values["checkpoint"], values["refiner"], values["refiner_switch"]) == ("sdxl", "sdxl-refiner", SWITCH)
    sent = handlers.send_to_generate(values)
    refiner = len(sent) - 7  # the refiner and its switch, then the ControlNet's five controls
    assert (sent[refiner]["value"], sent[refiner + 1]["value"]) == ("sdxl-refiner", SWITCH)
    plain = service.generate("sdxl", "auto", GenerationParams(**{**params.__dict__, "refiner": ""}))
    plain.images[0].save(saved, pnginfo=_png_text(plain.images[0]))
    _, values, _ = handlers.png_info(str(saved))
    assert values["refiner"] == "" and handlers.send_to_generate(values)[refiner]["value"] == ""


def _png_text(image):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in image.info.items():
        if isinstance(value, str):
            info.add_text(key, value)
    return info
