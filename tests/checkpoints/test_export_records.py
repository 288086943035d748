"""What a new user met exporting the models `dwb train` makes: an export records the size its model was trained at
and the settings it recommends, so `dwb sample` draws a tiny Flux.1-style model at 32 px and a tiny MMDiT at 16 px
from their folders and single files, at their own guidance and steps; the model card's loading code loads the
folder; the single-file message names what reads a transformer-only file; a re-exported folder's card says
"stored"; a refiner exports as a refiner; `load_path` at an exported folder says what it takes.

Two one-batch runs written by Composer's Trainer (tiny-flux over 20 T5 tokens, tiny MMDiT at 16 px)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from ..conftest import REPO, tiny_overrides


@pytest.fixture(scope="module")
def runs(shapes_data, components, tmp_path_factory) -> dict[str, Path]:
    from train.config import load_config
    from train.trainer import train

    root = tmp_path_factory.mktemp("trained")
    made = {}
    for name, config, res, extra in (("flux", "tiny-flux.yaml", 32, {"model.text_tokens": 20}),
                                     ("mmdit", "tiny-mmdit-phase1.yaml", 16, {})):
        folder = root / name
        train(load_config(REPO / "configs" / config, tiny_overrides(
            shapes_data, components, folder, res=res, max_duration="1ba", save_interval="1ba", eval_interval="null",
            preview_interval="null", **extra)))
        made[name] = folder / "ep0-ba1-rank0.pt"
    return made


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory) -> dict[str, Path]:
    """Each run exported as a folder and as a single file, as the new user did."""
    from dwb import main

    root = tmp_path_factory.mktemp("exports")
    made = {}
    for name, ckpt in runs.items():
        for kind, out in (("folder", root / name), ("file", root / f"{name}.safetensors")):
            assert main(["export", str(ckpt), str(out)]) in (0, None)
            made[f"{name}-{kind}"] = out
    return made


def drawn(dwb, source: Path, out: Path, *args: str) -> tuple[str, tuple[int, int], str]:
    """`dwb sample SOURCE OUT` with no size or guidance given: (its output, the image's size, its parameters)."""
    r = dwb("sample", str(source), str(out), "--prompt", "a red circle", "--seeds", "1", "--per-image", *args)
    assert r.returncode == 0, r.stderr
    [image] = out.with_suffix("").glob("*.png")
    with Image.open(image) as png:
        return r.stdout, png.size, png.text["parameters"]


@pytest.mark.parametrize("name, side, guidance", [("flux", 32, 0), ("mmdit", 16, 3)])
@pytest.mark.parametrize("kind", ["folder", "file"])
def test_an_export_draws_at_its_trained_size_with_its_recommended_settings(exports, runs, dwb, tmp_path, name, side,
                                                                           guidance, kind):
    """Friction 2 (our Flux-style export drew at 512, and --size 32 was refused), 3 (the MMDiT export drew at 32, not
    its 16) and 4 (the single files drew at SD3.5's guidance 3.5 and 28 steps, though their metadata held 3 and 20)."""
    from models.checkpoints import find_checkpoint, recommended_settings

    export = exports[f"{name}-{kind}"]
    said, size, parameters = drawn(dwb, export, tmp_path / "out.png", "--steps", "1")  # 20 steps took 10-18 s
    assert size == (side, side) and f"Size: {side}x{side}," in parameters
    assert f"guidance {guidance}, {side} px: the checkpoint's recommended settings" in said
    assert recommended_settings(find_checkpoint(export)) == {"guidance": guidance, "steps": 20, "size": side}
    if name == "flux":  # the size it was trained at, asked for, is drawn
        r = dwb("sample", str(export), str(tmp_path / "at.png"), "--size", str(side), "--steps", "1", "--seeds", "1")
        assert r.returncode == 0, r.stderr


def test_the_cards_loading_code_loads_the_flux_style_folder(exports):
    """Friction 1: the card said ``text_encoder_2=None, tokenizer_2=None``, which raised an AttributeError: the model
    is conditioned on T5. The MMDiT's card still leaves out the T5 it never had."""
    for name, absent in (("flux", ""), ("mmdit", ", text_encoder_3=None, tokenizer_3=None")):
        folder = exports[f"{name}-folder"]
        [code] = re.findall(r"^```python\n(.*?)^```$", (folder / "README.md").read_text(), re.M | re.S)
        loading = code[:code.index("\n", code.index("pipe = "))]  # up to the line that loads it
        assert loading.endswith(f'pipe = DiffusionPipeline.from_pretrained("path/to/this/folder"{absent})')
        names: dict = {}
        exec(loading.replace("path/to/this/folder", str(folder)), names)  # noqa: S102 - the card we wrote
        assert type(names["pipe"]).__name__ == ("FluxPipeline" if name == "flux" else "StableDiffusion3Pipeline")


def test_the_flux_style_single_file_message_names_what_reads_it(runs, dwb, tmp_path):
    """Friction 11: the message suggested AUTOMATIC1111 and ``from_single_file(file, config=...)``, and neither loads
    a Flux transformer-only file."""
    out = tmp_path / "flux.safetensors"
    r = dwb("export", str(runs["flux"]), str(out))
    assert r.returncode == 0, r.stderr
    assert "AUTOMATIC1111" not in r.stdout and "FluxPipeline.from_single_file" not in r.stdout
    assert (f"the transformer alone: ComfyUI's and Forge's diffusion-model loaders, with its other parts from "
            f"flux.config/; diffusers' FluxPipeline.from_pretrained('{tmp_path / 'flux.config'}', transformer="
            f"FluxTransformer2DModel.from_single_file('{out}', config='{tmp_path / 'flux.config'}', "
            f"subfolder='transformer')) at Flux.1's published width, dwb sample {out} at any)") in r.stdout


def test_a_reexported_card_says_stored_as_its_images_do(exports, dwb, tmp_path):
    """Friction 15: a folder exported again said "raw weights" on its card where its images say "stored"."""
    out = tmp_path / "again"
    r = dwb("export", str(exports["mmdit-folder"]), str(out))
    assert r.returncode == 0, r.stderr
    card = (out / "README.md").read_text()
    assert "stored weights)" in card and "raw weights" not in card
    assert "Weights: stored" in drawn(dwb, out, tmp_path / "out.png", "--steps", "1")[2]


def test_a_refiner_exports_as_a_refiner(tmp_path, dwb):
    """Friction 12: exporting a refiner got the sampling message ("give it as the refiner of a base")."""
    from ..family_fixtures import write_sdxl_refiner

    torch.manual_seed(1)
    refiner = write_sdxl_refiner(tmp_path / "refiner", tmp_path / "tokenizers")
    r = dwb("export", str(refiner), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    card = (tmp_path / "out" / "README.md").read_text()
    assert 'pipeline_tag: "image-to-image"' in card and "A refiner (a second stage" in card
    single = dwb("export", str(refiner), str(tmp_path / "out.safetensors"))
    assert single.returncode != 0 and "dwb sample" not in single.stderr
    assert single.stderr.strip().splitlines()[-1] == (
        "error: refiner is a refiner, whose single file is not written yet: export it as a diffusers folder "
        "(dwb export REFINER FOLDER), which --refiner and the app open")
    refined = dwb("sample", str(tmp_path / "out"), str(tmp_path / "never.png"), "--steps", "1")
    assert refined.returncode != 0 and "is a Stable Diffusion XL refiner" in refined.stderr  # it stays a refiner


def test_load_path_at_an_exported_folder_says_what_it_takes(exports, shapes_data, components, tmp_path):
    """Friction 9: ``load_path`` at an exported folder said "checkpoint not found", though the folder exists."""
    from models.errors import WorkbenchError
    from train.config import load_config
    from train.trainer import checked_load_path

    folder = exports["mmdit-folder"]
    cfg = load_config(REPO / "configs/tiny-mmdit-phase1.yaml",
                      tiny_overrides(shapes_data, components, tmp_path, load_path=str(folder)))
    with pytest.raises(WorkbenchError) as refused:
        checked_load_path(cfg, {})
    message = str(refused.value)
    assert "\n" not in message and "not found" not in message
    assert "takes a Composer checkpoint" in message and f"model.init_from={folder}" in message
