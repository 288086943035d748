"""`dwb export NAME.safetensors` of SDXL, SD3.5 and Flux.1: each in the layout its authors publish, the same names
and tensors as the tests' own key maps write (tests/checkpoints/original_layout.py, written independently of the
exporter), read back by diffusers' own single-file loader to the same weights, and drawing through `dwb` what the
source folder draws. One export per family for the module."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import diffusers
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from models.export import export_checkpoint
from models.checkpoints import find_checkpoint, load_pipeline
from models.errors import CheckpointError, WorkbenchError
from models.families import build_on_meta, family_named
from models.generation import Settings, generate_images

from ..checkpoints.original_layout import flux_to_original, write_sd3_single_file, write_sdxl_single_file

SETTINGS = Settings(steps=3, guidance=4.0, width=64, height=64, sampler="Euler")
PIPELINES = {"sdxl": diffusers.StableDiffusionXLPipeline, "sd3": diffusers.StableDiffusion3Pipeline,
             "flux-dev": diffusers.FluxPipeline, "flux-schnell": diffusers.FluxPipeline}


@pytest.fixture(scope="module")
def sources(family_folders, tmp_path_factory) -> dict[str, Path]:
    """The tiny folders; SD3's with CLIP-L's projection the identity, as the published layout takes it (diffusers'
    reader sets it so: SD3 conditions on CLIP-L's unprojected pooled output)."""
    sd3 = diffusers.StableDiffusion3Pipeline.from_pretrained(family_folders["sd3"])
    with torch.no_grad():
        sd3.text_encoder.text_projection.weight.copy_(torch.eye(sd3.text_encoder.config.hidden_size))
    folder = tmp_path_factory.mktemp("sources") / "sd3"
    sd3.save_pretrained(folder)
    return {**family_folders, "sd3": folder}


@pytest.fixture(scope="module")
def exported(sources, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("exported")
    return {name: export_checkpoint(str(sources[name]), out / f"{name}.safetensors")[0]
            for name in ("sdxl", "sd3", "flux-dev")}


def reference_layout(name: str, source: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The same pipeline in the published layout by the tests' own key maps."""
    pipe = PIPELINES[name].from_pretrained(source)
    if name == "sdxl":
        weights = load_file(write_sdxl_single_file(pipe, tmp_path / "reference.safetensors"))
        # OpenCLIP's logit scale: in sgm's files, read by no sampler (diffusers' converter skips it), and not in a
        # diffusers model, so the export cannot know it
        return {k: v for k, v in weights.items() if not k.endswith("logit_scale")}
    if name == "sd3":
        return load_file(write_sd3_single_file(pipe, tmp_path / "reference.safetensors"))
    return flux_to_original(pipe.transformer)


@pytest.mark.parametrize("name", ["sdxl", "sd3", "flux-dev"])
def test_an_export_holds_the_published_names_and_tensors(name, sources, exported, tmp_path):
    expected = reference_layout(name, sources[name], tmp_path)
    written = load_file(exported[name])
    assert set(written) == set(expected)
    different = [k for k in expected if not torch.equal(written[k], expected[k].contiguous())]
    assert not different, different[:3]
    assert not exported[name].with_suffix(".yaml").exists()  # AUTOMATIC1111 reads an SD 1/2 file's config from it
    with safe_open(str(exported[name]), "pt") as f:
        assert f.metadata()["dwb.family"] == family_named(name.split("-")[0]).name


def from_single_file(name: str, path: Path):
    """diffusers' own reader, offline, with NAME.config/: the whole pipeline from the file, or (Flux.1, the file
    holding the transformer alone) the transformer from it and the other parts from the folder."""
    from models.common import flux_single_file_widths

    config = str(path.with_name(path.stem + ".config"))
    options = dict(config=config, local_files_only=True, torch_dtype=torch.float32)
    if not name.startswith("flux"):
        return PIPELINES[name].from_single_file(str(path), **options)
    flux_single_file_widths()  # diffusers 0.39's converter splits at Flux.1's published width (models.common.diffusers_patches)
    transformer = diffusers.FluxTransformer2DModel.from_single_file(str(path), subfolder="transformer", **options)
    return diffusers.FluxPipeline.from_pretrained(config, transformer=transformer, torch_dtype=torch.float32)


@pytest.mark.parametrize("name", ["sdxl", "sd3", "flux-dev"])
def test_diffusers_reads_an_export_back_to_the_same_weights(name, sources, exported):
    ours, source = from_single_file(name, exported[name]), PIPELINES[name].from_pretrained(sources[name])
    for part, module in source.components.items():
        if isinstance(module, torch.nn.Module):
            got, want = getattr(ours, part).state_dict(), module.state_dict()
            assert set(got) == set(want), part
            assert all(torch.equal(got[k], want[k]) for k in want), part


@pytest.mark.parametrize("name", ["sdxl", "sd3", "flux-dev"])
def test_an_export_draws_what_its_folder_draws(name, sources, exported):
    def draw(ref):
        return generate_images(load_pipeline(find_checkpoint(str(ref))), ["a red circle"], [3], SETTINGS)

    np.testing.assert_array_equal(draw(exported[name]), draw(sources[name]))


def test_a_half_flux_schnell_export_through_dwb(sources, tmp_path, dwb):
    """`--half`: every tensor float16, the config folder's parts too; schnell's file has no guidance input."""
    out = tmp_path / "schnell.safetensors"
    run = dwb("export", str(sources["flux-schnell"]), str(out), "--half")
    assert run.returncode == 0, run.stderr
    assert f"config='{tmp_path / 'schnell.config'}'" in run.stdout
    source = diffusers.FluxTransformer2DModel.from_pretrained(sources["flux-schnell"], subfolder="transformer")
    expected, written = flux_to_original(source), load_file(out)
    assert set(written) == set(expected) and not any(k.startswith("guidance_in.") for k in written)
    assert all(written[k].dtype == torch.float16 and torch.equal(written[k], expected[k].half()) for k in expected)
    vae = load_file(tmp_path / "schnell.config" / "vae" / "diffusion_pytorch_model.safetensors")
    assert {v.dtype for v in vae.values()} == {torch.float16}
    assert not (tmp_path / "schnell.config" / "transformer" / "diffusion_pytorch_model.safetensors").exists()
    pipe = load_pipeline(find_checkpoint(str(out)))
    assert all(torch.equal(v, source.state_dict()[k].half().float()) for k, v in pipe.transformer.state_dict().items())


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_what_the_layout_cannot_hold_is_one_line_and_nothing_is_written(family_folders, tmp_path):
    """The tiny SD3 folder's CLIP-L has a projection of its own; the published layout has none (its reader takes
    the identity): refused in one line, nothing written."""
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CheckpointError) as refused:
        export_checkpoint(str(family_folders["sd3"]), out / "sd3.safetensors")
    assert str(refused.value).startswith("text_encoder.text_projection.weight is not the identity")
    assert "\n" not in str(refused.value)
    assert leftovers(out) == []


def test_an_export_failing_while_writing_leaves_nothing(sources, tmp_path, monkeypatch):
    """The weights written, the config folder failing (a full disk): neither is left, nor a partial name."""
    import errno

    from models.export import family_export

    def full_disk(folder, *args):
        Path(folder).mkdir()
        (Path(folder) / "model_index.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(family_export, "write_config_folder", full_disk)
    with pytest.raises(WorkbenchError) as refused:
        export_checkpoint(str(sources["flux-dev"]), tmp_path / "flux.safetensors")
    assert "\n" not in str(refused.value)
    assert leftovers(tmp_path) == []


def test_only_a_model_at_its_familys_published_configs_goes_without_a_config_folder():
    """SDXL at the published base configs is read without NAME.config/ (diffusers and `dwb` write them offline);
    SD3.5 and Flux.1 always need one (the T5 tokenizer), and a model of other sizes does."""
    from models.export.family_export import needs_config_folder

    def on_meta(family):
        return SimpleNamespace(**{name: build_on_meta(part) for name, part in family.variants[0].parts.items()})

    sdxl = family_named("sdxl")
    published = on_meta(sdxl)
    assert not needs_config_folder(published, sdxl)
    published.unet.register_to_config(cross_attention_dim=1024)
    assert needs_config_folder(published, sdxl)
    for name in ("sd3", "flux"):
        assert needs_config_folder(on_meta(family_named(name)), family_named(name))


def test_the_config_folder_is_a_diffusers_folder_of_the_same_model(sources, exported):
    """NAME.config/: every part's config as the source's, and no weights of what the file holds."""
    for name in ("sdxl", "sd3", "flux-dev"):
        config = exported[name].with_name(exported[name].stem + ".config")
        index = json.loads((config / "model_index.json").read_text())
        assert index["_class_name"] == PIPELINES[name].__name__
        source_configs = sorted(p.relative_to(sources[name]) for p in Path(sources[name]).glob("*/*.json"))
        assert sorted(p.relative_to(config) for p in config.glob("*/*.json")) == source_configs
        weights = {p.parent.name for p in config.glob("*/*.safetensors")}
        assert weights == ({"vae", "text_encoder", "text_encoder_2"} if name.startswith("flux") else set())
