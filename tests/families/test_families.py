"""Every family opens through the one door and generates through the one path, with the image plain diffusers
makes; its full-size parts count what their authors published; what a family cannot do is one line."""
from __future__ import annotations

import json

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from models.checkpoints import find_checkpoint, load_pipeline
from models.checkpoints.open import describe
from models.errors import WorkbenchError
from models.families import FAMILIES, family_named, family_of_folder, full_size_summary
from models.generation import Settings, generate_images

from ..conftest import run_dwb

PROMPT, SEED, STEPS, SIDE = "a red circle above a blue square", 7, 3, 64
FAMILY_OF = {"sdxl": "sdxl", "sd3": "sd3", "flux-dev": "flux", "flux-schnell": "flux"}


def plain_diffusers_image(folder, guidance: float | None) -> np.ndarray:
    """The image plain diffusers makes from the folder with its own saved scheduler (an Euler sampler in every
    fixture), as uint8."""
    index = json.loads((folder / "model_index.json").read_text())
    pipe = getattr(diffusers, index["_class_name"]).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {} if guidance is None else {"guidance_scale": guidance}
    images = pipe(PROMPT, num_inference_steps=STEPS, width=SIDE, height=SIDE, output_type="np",
                  generator=torch.Generator("cpu").manual_seed(SEED), **kwargs).images
    return (images * 255).round().astype(np.uint8)


@pytest.mark.parametrize("name", sorted(FAMILY_OF))
def test_each_family_generates_the_image_plain_diffusers_makes(name, family_folders):
    folder = family_folders[name]
    checkpoint = find_checkpoint(str(folder))
    info = describe(checkpoint)
    family = family_named(FAMILY_OF[name])
    assert info.family == family.name and family_of_folder(folder, name) is family
    assert info.prediction_type == ("flow" if family.schedule == "flow" else "epsilon")
    pipe = load_pipeline(checkpoint)
    assert type(pipe).__name__ == family.pipeline
    ours = generate_images(pipe, [PROMPT], [SEED], Settings(steps=STEPS, guidance=4.0, width=SIDE, height=SIDE,
                                                            sampler="Euler"))
    reference = plain_diffusers_image(folder, guidance=4.0)
    assert ours.shape == reference.shape == (1, SIDE, SIDE, 3)
    np.testing.assert_array_equal(ours, reference)
    # the image depends on the prompt (the text encoders condition it): a test that could not fail otherwise
    other = generate_images(pipe, ["a green triangle"], [SEED], Settings(steps=STEPS, guidance=4.0, width=SIDE,
                                                                         height=SIDE, sampler="Euler"))
    assert np.abs(other.astype(int) - ours).max() > 0


def test_flux_schnell_takes_no_guidance_and_dev_takes_it_as_an_input(family_folders):
    schnell, dev = (load_pipeline(find_checkpoint(str(family_folders[n]))) for n in ("flux-schnell", "flux-dev"))
    draw = lambda pipe, g: generate_images(pipe, [PROMPT], [SEED], Settings(steps=2, guidance=g, width=SIDE,  # noqa: E731
                                                                            height=SIDE, sampler="Euler"))
    np.testing.assert_array_equal(draw(schnell, 1.0), draw(schnell, 9.0))
    assert np.abs(draw(dev, 1.0).astype(int) - draw(dev, 9.0)).max() > 0


def test_what_a_family_cannot_do_is_one_line(family_folders):
    flux = load_pipeline(find_checkpoint(str(family_folders["flux-dev"])))
    sd3 = load_pipeline(find_checkpoint(str(family_folders["sd3"])))
    with pytest.raises(WorkbenchError, match=r"^Flux.1 \(dev\) has no negative prompt"):
        generate_images(flux, [PROMPT], [0], Settings(steps=2, width=SIDE, height=SIDE, negative_prompt="blurry"))
    with pytest.raises(WorkbenchError, match=r"^Flux.1 cannot be sampled with 'Heun'; choose one of: Euler"):
        generate_images(flux, [PROMPT], [0], Settings(steps=2, width=SIDE, height=SIDE, sampler="Heun"))
    with pytest.raises(WorkbenchError, match="cannot be sampled with 'LMS'"):
        generate_images(sd3, [PROMPT], [0], Settings(steps=2, width=SIDE, height=SIDE, sampler="LMS"))
    with pytest.raises(WorkbenchError, match=r"^Flux.1 draws sides that are multiples of 16; the size is 66x66"):
        generate_images(flux, [PROMPT], [0], Settings(steps=2, width=66, height=66))


@pytest.mark.parametrize("sampler", ["DPM++ 2M", "UniPC", "Heun"])
def test_flow_samplers_step_the_checkpoints_own_flow(sampler, family_folders):
    """Each sampler a flow family offers is diffusers' own scheduler, built from the checkpoint's flow config: the
    image equals plain diffusers with that scheduler class made from the same config."""
    from diffusers import DPMSolverMultistepScheduler, FlowMatchHeunDiscreteScheduler, UniPCMultistepScheduler

    folder = family_folders["sd3"]
    pipe = load_pipeline(find_checkpoint(str(folder)))
    ours = generate_images(pipe, [PROMPT], [SEED], Settings(steps=STEPS, guidance=4.0, width=SIDE, height=SIDE,
                                                            sampler=sampler))
    plain = diffusers.StableDiffusion3Pipeline.from_pretrained(folder)
    config, flow = plain.scheduler.config, dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    plain.scheduler = {"DPM++ 2M": lambda: DPMSolverMultistepScheduler.from_config(config, **flow),
                       "UniPC": lambda: UniPCMultistepScheduler.from_config(config, **flow),
                       "Heun": lambda: FlowMatchHeunDiscreteScheduler.from_config(config)}[sampler]()
    plain.set_progress_bar_config(disable=True)
    reference = plain(PROMPT, num_inference_steps=STEPS, guidance_scale=4.0, width=SIDE, height=SIDE, output_type="np",
                      generator=torch.Generator("cpu").manual_seed(SEED)).images
    np.testing.assert_array_equal(ours, (reference * 255).round().astype(np.uint8))


def test_dwb_sample_draws_a_flux_folder(family_folders, tmp_path):
    for name in ("flux-dev",):  # the other families through the same command path: in process above
        out = tmp_path / f"{name}.png"
        run = run_dwb("sample", str(family_folders[name]), str(out), "--prompt", PROMPT, "--steps", "2", "--size",
                      str(SIDE), "--seeds", "2", "--sampler", "Euler")
        assert run.returncode == 0, run.stderr[-2000:]
        with Image.open(out) as image:
            assert image.width >= 2 * SIDE and "Steps: 2, Sampler: Euler" in image.text["parameters"]


def test_a_model_too_big_for_the_machine_is_one_line_before_its_weights_are_read(family_folders, tmp_path):
    """The door reads only the safetensors headers to know what a folder needs: with the machine's memory capped
    under it, `dwb sample` says so in one line (no traceback, no image, no OOM kill)."""
    out = tmp_path / "never.png"
    run = run_dwb("sample", str(family_folders["flux-dev"]), str(out), "--prompt", PROMPT, "--steps", "1",
                  env={"DWB_MEMORY_MB": "4"})
    assert run.returncode != 0 and not out.exists()
    assert run.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "(Flux.1) needs" in run.stderr and "this machine has 4 MiB free" in run.stderr
    assert "Traceback" not in run.stderr


def test_full_size_parts_count_what_their_authors_published():
    """Every family's published models built at full size on the meta device (nothing downloaded or allocated):
    the parts each published figure speaks of count within its tolerance of it."""
    for family in FAMILIES:
        for row in full_size_summary(family):
            variant = family.variant(row["variant"])
            assert abs(row["counted"] / row["published"] - 1) <= variant.published_tolerance, row


def test_dwb_export_writes_a_folder_plain_diffusers_opens_and_a_single_file_it_cannot_write_is_one_line(
        family_folders, tmp_path):
    folder = family_folders["sd3"]
    run = run_dwb("export", str(folder), str(tmp_path / "sd3-export"), "--half")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "DiffusionPipeline.from_pretrained" in run.stdout
    exported = diffusers.DiffusionPipeline.from_pretrained(tmp_path / "sd3-export", variant="fp16")
    original = diffusers.DiffusionPipeline.from_pretrained(folder)
    assert type(exported) is type(original) is diffusers.StableDiffusion3Pipeline
    for name, weight in original.transformer.state_dict().items():
        assert torch.equal(exported.transformer.state_dict()[name], weight.half()), name

    from models.export import export_checkpoint

    with pytest.raises(WorkbenchError) as refused:  # the line `dwb export` prints
        export_checkpoint(str(folder), tmp_path / "sd3.safetensors")
    assert not (tmp_path / "sd3.safetensors").exists()
    # the tiny fixture's CLIP-L projects its pooled output; the published layout holds no projection
    assert str(refused.value) == ("text_encoder.text_projection.weight is not the identity, which the published layout "
                                  "takes it to be (diffusers' reader sets it so): export it as a diffusers folder")


@pytest.mark.parametrize("attack", ["auto_map in tokenizer_2", "tokenizer_3 reads outside", "unknown pipeline class",
                                    "a part from another library"])
def test_a_hostile_family_folder_is_refused_in_one_line_before_any_code_runs(attack, family_folders, tmp_path):
    """The checks a folder of SD 1/2 gets hold for every tokenizer and part of the newer layouts."""
    import shutil

    folder = shutil.copytree(family_folders["sd3"], tmp_path / "sd3")

    def edit(path, change):
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    if attack == "auto_map in tokenizer_2":
        edit(folder / "tokenizer_2" / "tokenizer_config.json",
             lambda d: d.update(auto_map={"AutoTokenizer": ["evil.Tokenizer", None]}))
        expected = "asks for custom code (auto_map); refused"
    elif attack == "tokenizer_3 reads outside":
        edit(folder / "tokenizer_3" / "tokenizer_config.json", lambda d: d.update(tokenizer_file="../../etc/passwd"))
        expected = "points tokenizer_file outside its folder"
    elif attack == "unknown pipeline class":
        edit(folder / "model_index.json", lambda d: d.update(_class_name="StableDiffusionUpscalePipeline"))
        expected = "a StableDiffusionUpscalePipeline folder; the workbench opens "
    else:
        edit(folder / "model_index.json", lambda d: d.update(text_encoder_3=["evil_package", "Encoder"]))
        expected = "only diffusers and transformers parts are opened"
    with pytest.raises(WorkbenchError) as refused:  # what `dwb sample` prints as its one line
        load_pipeline(find_checkpoint(str(folder)))
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_flux_hub_id_in_the_local_cache_opens_with_downloads_off(family_folders, tmp_path, monkeypatch):
    """A hub id resolves to its snapshot in the Hugging Face cache (the layout huggingface_hub writes), and the
    family is found from the snapshot's model_index.json like a folder's."""
    from ..checkpoints.fixtures import commit_hash, write_hub_snapshot

    cache = tmp_path / "hub"
    write_hub_snapshot(cache, "black-forest-labs/FLUX.1-dev", family_folders["flux-dev"], commit_hash("main"),
                       refs=("main",))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    checkpoint = find_checkpoint("black-forest-labs/FLUX.1-dev", allow_download=False)
    assert (checkpoint.kind, describe(checkpoint).family) == ("hub", "flux")
    image = generate_images(load_pipeline(checkpoint), [PROMPT], [SEED], Settings(steps=2, width=SIDE, height=SIDE))
    assert image.shape == (1, SIDE, SIDE, 3)


def test_flux_images_carry_their_guidance_the_way_forge_writes_it_and_png_info_reads_it_back(family_folders,
                                                                                             tmp_path):
    """Flux.1-dev takes its scale as an input: Forge writes "CFG scale: 1, Distilled CFG Scale: 3.5"; schnell
    takes none ("CFG scale: 1"); SDXL keeps "CFG scale". PNG Info (ours) and an A1111-format reader read them."""
    from app.png_info import read_png, settings_from
    from models.generation import parse_parameters, write_grid

    for name, expected in (("flux-dev", "CFG scale: 1, Distilled CFG Scale: 3.5"), ("flux-schnell", "CFG scale: 1,"),
                           ("sdxl", "CFG scale: 3.5,")):
        out = write_grid(load_pipeline(find_checkpoint(str(family_folders[name]))), tmp_path / f"{name}.png",
                         [PROMPT], [0], settings=Settings(steps=1, guidance=3.5, width=SIDE, height=SIDE))
        text, record, _ = read_png(out)
        assert expected in text and ("Distilled" in text) == (name == "flux-dev")
        assert record.guidance_kind == {"flux-dev": "distilled", "flux-schnell": "none", "sdxl": "cfg"}[name]
        from_text = settings_from(text, lambda digest: None)[0]  # the parameters text alone, as from another tool
        assert from_text["guidance"] == (1.0 if name == "flux-schnell" else 3.5)
        assert parse_parameters(text)["Steps"] == "1"


def test_a_newer_familys_checkpoint_recommends_what_its_published_model_is_sampled_at(family_folders):
    from models.checkpoints import recommended_settings

    found = {name: recommended_settings(find_checkpoint(str(family_folders[name]))) for name in FAMILY_OF}
    assert found == {"sdxl": {"guidance": 5.0, "steps": 30}, "sd3": {"guidance": 4.5, "steps": 40},
                     "flux-dev": {"guidance": 3.5, "steps": 28}, "flux-schnell": {"guidance": 0.0, "steps": 4}}
