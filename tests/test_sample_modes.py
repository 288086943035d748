"""Image to image, inpainting and hires fix through the one generation path: for every family (SD 2 as the reduced
pipeline, and the tiny SDXL, SD3 and Flux.1-dev folders diffusers wrote), each mode's image equals the one diffusers'
own pipeline for it draws from the same inputs (a hires fix: diffusers' two calls); an inpainting single file
(a 9-channel UNet) opens through the door and inpaints as diffusers' inpainting pipeline does; the PNG parameters
carry every new setting and read back; hostile inputs are one line."""
from __future__ import annotations

import struct
import zlib

import diffusers
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from models.checkpoints import load_pipeline
from models.errors import WorkbenchError
from models.generation import (HiresFix, ImageRecord, InitImage, Settings, generate_images, modes_of,
                               parse_parameters, read_image)
from models.generation.samplers import make_sampler

from .checkpoints.fixtures import reduced_pipeline
from .checkpoints.original_layout import write_single_file

PROMPT, SEEDS, STEPS, SIDE, STRENGTH, BLUR = "a red circle above a blue square", [5, 6], 4, 32, 0.6, 2
FAMILIES = ("sd2", "sdxl", "sd3", "flux-dev")


def as_bytes(images: np.ndarray) -> np.ndarray:
    return (images * 255).round().astype(np.uint8)


def generators() -> list[torch.Generator]:
    return [torch.Generator("cpu").manual_seed(s) for s in SEEDS]


@pytest.fixture(scope="module")
def init_and_mask() -> tuple[Image.Image, Image.Image]:
    rng = np.random.default_rng(0)
    init = Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8))
    mask = Image.new("L", (SIDE, SIDE), 0)
    mask.paste(255, (8, 8, 24, 24))
    return init, mask


@pytest.fixture(scope="module")
def pipes(family_folders) -> dict:
    """{family: (the workbench's pipeline through the door, diffusers' own from the same weights)}."""
    out = {"sd2": (reduced_pipeline("sd2", seed=2),) * 2}
    for name in FAMILIES[1:]:
        folder = family_folders[name]
        out[name] = (load_pipeline(str(folder)), diffusers.DiffusionPipeline.from_pretrained(folder))
    return out


def plain(reference, cls: str, sampler: str):
    """diffusers' own pipeline ``cls`` from the reference pipeline's modules (its ``from_pipe``), with ``sampler``."""
    pipe = getattr(diffusers, cls).from_pipe(reference)
    pipe.scheduler = make_sampler(sampler, reference.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def guidance_of(name: str) -> dict:
    return {"guidance_scale": 3.0}


def sized(name: str, size: int) -> dict:
    """SD's and SDXL's image-to-image calls take their size from their image alone."""
    return {} if name in ("sd2", "sdxl") else {"width": size, "height": size}


@pytest.mark.parametrize("name", FAMILIES)
def test_image_to_image_and_inpainting_equal_diffusers_own_pipelines(name, pipes, init_and_mask):
    from models.families import family_of_pipeline

    ours_pipe, reference = pipes[name]
    family = family_of_pipeline(ours_pipe)
    init, mask = init_and_mask
    settings = Settings(steps=STEPS, guidance=3.0, width=SIDE, height=SIDE, sampler="Euler")
    drawn = generate_images(ours_pipe, [PROMPT] * 2, SEEDS, Settings(**{**settings.__dict__,
                                                                        "init": InitImage(init, STRENGTH)}))
    img2img = plain(reference, family.img2img_pipeline, "Euler")
    expected = img2img([PROMPT] * 2, image=[init] * 2, strength=STRENGTH, num_inference_steps=STEPS, output_type="np",
                       generator=generators(), **guidance_of(name), **sized(name, SIDE)).images
    assert np.array_equal(drawn, as_bytes(expected))

    inpainted = generate_images(ours_pipe, [PROMPT] * 2, SEEDS, Settings(**{**settings.__dict__, "init": InitImage(
        init, STRENGTH, mask, BLUR)}))
    inpaint = plain(reference, family.inpaint_pipeline, "Euler")
    expected = inpaint([PROMPT] * 2, image=[init] * 2, mask_image=[inpaint.mask_processor.blur(mask, BLUR)] * 2,
                       strength=STRENGTH,
                       num_inference_steps=STEPS, output_type="np", generator=generators(), width=SIDE, height=SIDE,
                       **guidance_of(name)).images
    assert np.array_equal(inpainted, as_bytes(expected))
    assert not np.array_equal(inpainted, drawn)  # the mask is drawn with: not image to image under another name


@pytest.mark.parametrize("name", FAMILIES)
def test_a_latent_hires_fix_is_diffusers_two_calls(name, pipes):
    ours_pipe, reference = pipes[name]
    hires = HiresFix(scale=1.5, steps=3, upscaler="Latent", strength=0.5)
    drawn = generate_images(ours_pipe, [PROMPT] * 2, SEEDS, Settings(steps=STEPS, guidance=3.0, width=SIDE,
                                                                     height=SIDE, sampler="Euler", hires=hires))
    from models.families import family_of_pipeline

    family, target = family_of_pipeline(ours_pipe), 48
    first = plain(reference, type(reference).__name__, "Euler")
    generator = generators()
    latents = first([PROMPT] * 2, num_inference_steps=STEPS, width=SIDE, height=SIDE, output_type="latent",
                    generator=generator, **guidance_of(name)).images
    if latents.ndim == 3:  # Flux.1's packed latents, unpacked by its own pipeline
        latents = diffusers.FluxPipeline._unpack_latents(latents, SIDE, SIDE, reference.vae_scale_factor)
    scale = reference.vae_scale_factor
    latents = F.interpolate(latents, size=(target // scale, target // scale), mode="bilinear")
    second = plain(reference, family.img2img_pipeline, "Euler")
    expected = second([PROMPT] * 2, image=latents, strength=0.5, num_inference_steps=3, output_type="np",
                      generator=generator, **guidance_of(name), **sized(name, target)).images
    assert drawn.shape == (2, target, target, 3)
    assert np.array_equal(drawn, as_bytes(expected))


def test_a_pixel_hires_fix_is_diffusers_two_calls_with_lanczos_between(pipes):
    ours_pipe, reference = pipes["sd2"]
    hires = HiresFix(scale=2, upscaler="Lanczos", strength=0.4)
    drawn = generate_images(ours_pipe, [PROMPT], SEEDS[:1], Settings(steps=STEPS, guidance=3.0, width=SIDE,
                                                                     height=SIDE, sampler="DDIM", hires=hires))
    generator = generators()[:1]
    first = plain(reference, "StableDiffusionPipeline", "DDIM")(
        PROMPT, num_inference_steps=STEPS, guidance_scale=3.0, width=SIDE, height=SIDE, output_type="pil",
        generator=generator).images[0]
    expected = plain(reference, "StableDiffusionImg2ImgPipeline", "DDIM")(
        PROMPT, image=first.resize((64, 64), Image.Resampling.LANCZOS), strength=0.4, num_inference_steps=STEPS,
        guidance_scale=3.0, output_type="np", generator=generator).images
    assert np.array_equal(drawn, as_bytes(expected))


def test_an_inpainting_single_file_opens_through_the_door_and_inpaints_as_diffusers_does(tmp_path, init_and_mask):
    from diffusers import UNet2DConditionModel

    reference = reduced_pipeline("sd1", seed=4)
    torch.manual_seed(4)
    reference.unet = UNet2DConditionModel(  # the reduced UNet, taking latents, masked-image latents and the mask
        sample_size=8, in_channels=9, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=64,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=2)
    path = write_single_file(reference, tmp_path / "inpainting.safetensors", "sd1", prediction_type="epsilon")
    pipe = load_pipeline(str(path))
    assert pipe.unet.config.in_channels == 9
    init, mask = init_and_mask
    drawn = generate_images(pipe, [PROMPT], SEEDS[:1], Settings(steps=STEPS, guidance=3.0, width=SIDE, height=SIDE,
                                                                sampler="Euler", init=InitImage(init, 1.0, mask, 0)))
    expected = plain(reference, "StableDiffusionInpaintPipeline", "Euler")(
        PROMPT, image=init, mask_image=mask, strength=1.0, num_inference_steps=STEPS, guidance_scale=3.0,
        width=SIDE, height=SIDE, output_type="np", generator=generators()[:1]).images
    assert np.array_equal(drawn, as_bytes(expected))
    with pytest.raises(WorkbenchError, match="inpainting model .* draws from an init image and a mask"):
        generate_images(pipe, [PROMPT], [0], Settings(steps=1, width=SIDE, height=SIDE))
    # the same model as diffusers saves an inpainting pipeline (a hub id's folder): found as SD and inpaints alike
    diffusers.StableDiffusionInpaintPipeline.from_pipe(reference).save_pretrained(tmp_path / "inpainting")
    folder = generate_images(load_pipeline(str(tmp_path / "inpainting")), [PROMPT], SEEDS[:1], Settings(
        steps=STEPS, guidance=3.0, width=SIDE, height=SIDE, sampler="Euler", init=InitImage(init, 1.0, mask, 0)))
    assert np.array_equal(folder, drawn)


def test_the_png_parameters_carry_each_mode_as_a1111_writes_it_and_read_back(init_and_mask):
    init, mask = init_and_mask
    cases = {
        "inpaint": (Settings(steps=4, init=InitImage(init, 0.6, mask, 6)),
                    {"Denoising strength": "0.6", "Mask blur": "6"}),
        "img2img": (Settings(steps=4, init=InitImage(init, 0.35)), {"Denoising strength": "0.35"}),
        "txt2img": (Settings(steps=4, width=32, height=32, hires=HiresFix(2.5, 7, "Latent (bicubic)", 0.45)),
                    {"Denoising strength": "0.45", "Hires upscale": "2.5", "Hires steps": "7",
                     "Hires upscaler": "Latent (bicubic)"}),
    }
    for mode, (settings, fields) in cases.items():
        record = ImageRecord.of(settings, PROMPT, 3, (80, 80), "Euler", "tiny", "ab" * 5, "stored")
        parsed = parse_parameters(record.parameters())
        assert {k: parsed[k] for k in fields} == fields
        assert modes_of(parsed) == {"mode": mode, **{key: parsed[name] for key, name in (
            ("strength", "Denoising strength"), ("mask_blur", "Mask blur"), ("hires_scale", "Hires upscale"),
            ("hires_steps", "Hires steps"), ("hires_upscaler", "Hires upscaler")) if name in parsed}}
        assert ImageRecord.from_chunk(record.pnginfo()["dwb"]) == record
    hires_record = ImageRecord.of(cases["txt2img"][0], PROMPT, 3, (80, 80), "Euler", "tiny", "ab" * 5, "stored")
    assert parse_parameters(hires_record.parameters())["Size"] == "32x32"  # A1111's: the first draw's size
    plain_text = ImageRecord.of(Settings(steps=4), PROMPT, 3, (32, 32), "Euler", "tiny", "ab" * 5, "stored")
    assert modes_of(parse_parameters(plain_text.parameters())) == {"mode": ""}
    assert "Denoising" not in plain_text.parameters()


def giant_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` pixels, with a few bytes of pixel data: what a
    decompression bomb's header says before any of it is inflated."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def test_hostile_inputs_are_one_line(tmp_path, init_and_mask):
    init, mask = init_and_mask
    with pytest.raises(WorkbenchError, match=r"^the mask is 16x16 and the init image 32x32: a mask covers") as e:
        InitImage(init, 0.5, mask.resize((16, 16)))
    assert "\n" not in str(e.value)
    for strength in (0, -0.1, 1.01, float("nan"), "x"):
        with pytest.raises(WorkbenchError, match=r"strength must be .*\(0, 1\]"):
            InitImage(init, strength)
    bombs = ((5_000, "is 5000x5000 pixels"), (100_000, r"declares over [\d,]+ pixels \(a decompression bomb\)"))
    for side, said in bombs:
        bomb = tmp_path / f"bomb-{side}.png"
        bomb.write_bytes(giant_png(side, side))
        with pytest.raises(WorkbenchError, match=rf"^--init-image {said}.*; at most 16,777,216 are read"):
            read_image(bomb, "--init-image")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(WorkbenchError, match="^--mask is not a readable PNG, JPEG or WebP"):
        read_image(tmp_path / "text.png", "--mask")
    with pytest.raises(WorkbenchError, match="hires upscale must be"):
        HiresFix(scale=9)


def test_dwb_sample_inpaints_and_records_what_it_was_drawn_from(dwb, tmp_path, init_and_mask, family_folders):
    init, mask = init_and_mask
    init.save(tmp_path / "init.png")
    mask.save(tmp_path / "mask.png")
    folder = family_folders["sdxl"]
    run = dwb("sample", str(folder), str(tmp_path / "out.png"), "--prompt", PROMPT, "--seed", "5", "--seeds", "1",
              "--steps", "3", "--sampler", "Euler", "--init-image", str(tmp_path / "init.png"), "--mask",
              str(tmp_path / "mask.png"), "--strength", "0.6", "--mask-blur", "2", "--per-image")
    assert run.returncode == 0, run.stderr
    written = Image.open(tmp_path / "out" / "00000-5.png")
    parsed = parse_parameters(written.info["parameters"])
    assert (parsed["Denoising strength"], parsed["Mask blur"], parsed["Size"]) == ("0.6", "2", "32x32")
    again = generate_images(load_pipeline(str(folder)), [PROMPT], [5], Settings(
        steps=3, guidance=float(parsed["CFG scale"]), width=32, height=32, sampler="Euler",
        init=InitImage(init, 0.6, mask, 2)))
    assert np.array_equal(np.asarray(written.convert("RGB")), again[0])
    for flags, message in ((["--strength", "0"], "strength must be in (0, 1]"),
                           (["--mask", str(tmp_path / "mask.png")], "--mask marks what to redraw of an --init-image")):
        refused = dwb("sample", str(folder), str(tmp_path / "no.png"), *flags)
        assert refused.returncode != 0 and message in refused.stderr.strip().splitlines()[-1]  # argparse's usage above


def test_an_sdxl_inpainting_folder_opens_through_the_door_and_inpaints_as_diffusers_does(pipes, init_and_mask,
                                                                                          tmp_path):
    from diffusers import UNet2DConditionModel

    _, base = pipes["sdxl"]
    torch.manual_seed(5)
    unet = UNet2DConditionModel.from_config({**base.unet.config, "in_channels": 9})  # the base's UNet taking the mask
    reference = diffusers.StableDiffusionXLInpaintPipeline(**{**base.components, "unet": unet})
    reference.save_pretrained(tmp_path / "sdxl-inpainting")
    init, mask = init_and_mask
    drawn = generate_images(load_pipeline(str(tmp_path / "sdxl-inpainting")), [PROMPT], SEEDS[:1], Settings(
        steps=STEPS, guidance=3.0, width=SIDE, height=SIDE, sampler="Euler", init=InitImage(init, 1.0, mask, 0)))
    expected = plain(reference, "StableDiffusionXLInpaintPipeline", "Euler")(
        PROMPT, image=init, mask_image=mask, strength=1.0, num_inference_steps=STEPS, guidance_scale=3.0,
        width=SIDE, height=SIDE, output_type="np", generator=generators()[:1]).images
    assert np.array_equal(drawn, as_bytes(expected))


@pytest.mark.parametrize("name", FAMILIES)
def test_clip_skip_is_diffusers_clip_skip_for_the_families_that_take_it(name, pipes):
    from models.families import family_of_pipeline

    ours_pipe, reference = pipes[name]
    settings = Settings(steps=2, guidance=3.0, width=SIDE, height=SIDE, sampler="Euler", clip_skip=2)
    if not family_of_pipeline(ours_pipe).takes_clip_skip:
        with pytest.raises(WorkbenchError, match="takes no clip skip: its CLIP tower gives its pooled output alone"):
            generate_images(ours_pipe, [PROMPT], SEEDS[:1], settings)
        return
    drawn = generate_images(ours_pipe, [PROMPT], SEEDS[:1], settings)
    expected = plain(reference, type(reference).__name__, "Euler")(
        PROMPT, num_inference_steps=2, guidance_scale=3.0, width=SIDE, height=SIDE, clip_skip=1, output_type="np",
        generator=generators()[:1]).images
    assert np.array_equal(drawn, as_bytes(expected))
    assert not np.array_equal(drawn, generate_images(ours_pipe, [PROMPT], SEEDS[:1],
                                                     Settings(**{**settings.__dict__, "clip_skip": 1})))
    record = ImageRecord.of(settings, PROMPT, 5, (SIDE, SIDE), "Euler", "tiny", "ab" * 5, "stored")
    assert parse_parameters(record.parameters())["Clip skip"] == "2"
