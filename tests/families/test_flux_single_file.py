"""Flux.1 transformer files as Black Forest Labs publish them (the transformer alone, in their names) open end to
end: `dwb sample` of a tiny dev and schnell file draws what its diffusers folder draws.

The files are written by inverting diffusers' own converter (``convert_flux_transformer_checkpoint_to_diffusers``):
it is run, unpatched and at the published width, on a probe checkpoint whose every tensor says, row by row, which
original name it was read from and which row it was; what the converter makes of each row is its key map, read
backwards onto the tiny model's weights. The names are then exactly those the converter reads, and agree with the
test's own map from Black Forest Labs' reference code (``tests/checkpoints/original_layout.flux_to_original``)."""
from __future__ import annotations

import inspect
import shutil

import diffusers
import numpy as np
import pytest
import torch
from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers
from PIL import Image
from safetensors.torch import save_file

from models.checkpoints import find_checkpoint, load_pipeline
from models.checkpoints.open import describe
from models.generation import Settings, generate_images

from ..checkpoints.original_layout import flux_to_original
from ..conftest import run_dwb

PROMPT, SEED = "a red circle above a blue square", 7
SETTINGS = Settings(steps=2, guidance=3.5, width=64, height=64, sampler="Euler")
PUBLISHED_WIDTH = 3072
PROBE_ROWS = 3 * PUBLISHED_WIDTH + 4 * PUBLISHED_WIDTH  # the longest fused weight: a single block's q, k, v and MLP


class Probe(dict):
    """An original checkpoint as the converter reads it: the names it counts blocks and guidance by, and for every
    name it pops a tensor of ``PROBE_ROWS`` rows, each row (number of the name popped, row)."""

    def __init__(self, double: int, single: int, guidance: bool):
        super().__init__({k: None for k in [*(f"double_blocks.{i}" for i in range(double)),
                                             *(f"single_blocks.{i}" for i in range(single)),
                                             *(["guidance"] if guidance else [])]})
        self.popped: list[str] = []

    def pop(self, key, *default):
        self.popped.append(key)
        return torch.stack([torch.full((PROBE_ROWS,), len(self.popped) - 1), torch.arange(PROBE_ROWS)], dim=1)


def converter_key_map(transformer) -> tuple[list[str], dict[str, list[tuple[int, int, int, int]]]]:
    """(the original names the converter reads, and for each diffusers name the runs of original rows it is made
    of: (name number, first row, end row, where the run starts in the diffusers tensor)), at the published width."""
    config = transformer.config
    probe = Probe(config.num_layers, config.num_single_layers, config.guidance_embeds)
    runs = {}
    for name, rows in convert_flux_transformer_checkpoint_to_diffusers(probe).items():
        jumps = (rows[1:, 0] != rows[:-1, 0]) | (rows[1:, 1] != rows[:-1, 1] + 1)
        breaks = [0, *(1 + torch.nonzero(jumps).flatten()).tolist(), len(rows)]
        runs[name] = [(int(rows[a, 0]), int(rows[a, 1]), int(rows[b - 1, 1]) + 1, a) for a, b in zip(breaks, breaks[1:])]
    return probe.popped, runs


def flux_to_original_by_converter(transformer, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tiny transformer in the names diffusers' converter reads, each row where the converter takes it from."""
    names, runs = converter_key_map(transformer)
    weights = transformer.state_dict()
    assert set(runs) == set(weights), "the converter makes names the model does not have, or misses some"
    sources = {name: {r[0] for r in pieces} for name, pieces in runs.items()}
    assert all(len(s) == 1 for s in sources.values()), "a diffusers weight made of two original ones"
    rows = {k: 0 for k in range(len(names))}
    for name, pieces in runs.items():
        rows[pieces[0][0]] += weights[name].shape[0]
    original = {}
    for name, pieces in runs.items():
        source = pieces[0][0]
        scale = rows[source] / PROBE_ROWS  # the tiny model's rows for each published row
        tensor = original.setdefault(source, torch.empty((rows[source], *weights[name].shape[1:])))
        for _, first, end, at in pieces:
            assert (first * scale).is_integer() and (end * scale).is_integer() and (at * scale).is_integer()
            a, b, p = int(first * scale), int(end * scale), int(at * scale)
            tensor[a:b] = weights[name][p:p + b - a]
    assert len(original) == len(names), "a name the converter reads is given no weight"
    return {prefix + names[k]: v.contiguous() for k, v in original.items()}


def write_flux_file(folder, path, prefix: str = ""):
    transformer = diffusers.FluxTransformer2DModel.from_pretrained(folder, subfolder="transformer")
    weights = flux_to_original_by_converter(transformer, prefix)
    save_file(weights, str(path))
    return path, transformer


@pytest.fixture(scope="module")
def flux_files(family_folders, tmp_path_factory):
    """Flux.1-dev with the ``model.diffusion_model.`` prefix and NAME.config/ beside it (its folder without the
    transformer's weights), Flux.1-schnell without a prefix and nothing beside it: its folder given as --parts."""
    out = tmp_path_factory.mktemp("flux-files")
    dev, _ = write_flux_file(family_folders["flux-dev"], out / "flux1-dev-tiny.safetensors", "model.diffusion_model.")
    shutil.copytree(family_folders["flux-dev"], out / "flux1-dev-tiny.config",
                    ignore=lambda where, names: [n for n in names if where.endswith("transformer") and
                                                 n.endswith(".safetensors")])
    schnell, _ = write_flux_file(family_folders["flux-schnell"], out / "flux1-schnell-tiny.safetensors")
    return {"flux-dev": (dev, []), "flux-schnell": (schnell, ["--parts", str(family_folders["flux-schnell"])])}


@pytest.mark.parametrize("name", ["flux-dev", "flux-schnell"])
def test_the_written_names_are_those_the_converter_reads_and_black_forest_labs_publish(name, family_folders):
    transformer = diffusers.FluxTransformer2DModel.from_pretrained(family_folders[name], subfolder="transformer")
    by_converter = flux_to_original_by_converter(transformer)
    by_reference = flux_to_original(transformer)
    assert set(by_converter) == set(by_reference)
    for key, value in by_reference.items():
        torch.testing.assert_close(by_converter[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("name", ["flux-dev", "flux-schnell"])
def test_dwb_sample_of_a_flux_transformer_file_draws_what_its_folder_draws(name, flux_files, family_folders,
                                                                          tmp_path):
    path, parts = flux_files[name]
    grid = tmp_path / "grid.png"
    run = run_dwb("sample", str(path), str(grid), *parts, "--prompt", PROMPT, "--seed", str(SEED), "--seeds", "1",
                  "--steps", str(SETTINGS.steps), "--guidance", str(SETTINGS.guidance), "--sampler", SETTINGS.sampler,
                  "--size", str(SETTINGS.width), "--per-image")
    assert run.returncode == 0, run.stderr[-2000:]
    drawn = np.asarray(Image.open(tmp_path / "grid" / f"00000-{SEED}.png").convert("RGB"))
    folder = load_pipeline(find_checkpoint(str(family_folders[name])))
    with torch.no_grad():  # the folder's transformer read in place from its mmapped file sits 24 bytes off a 64-byte
        for weight in folder.transformer.parameters():  # boundary, and the CPU's matrix kernels round differently
            weight.data = weight.data.clone()  # there (one pixel of 12,288 one level apart): in memory of its own,
    expected = generate_images(folder, [PROMPT], [SEED], SETTINGS)  # as the file's converted weights are
    np.testing.assert_array_equal(drawn, expected[0])
    assert drawn.std() > 1  # a picture, not a constant


def test_a_flux_file_is_described_at_its_folder_size(flux_files, family_folders):
    """Flux.1's transformer records no sample size: a file is described at the size its folder is."""
    path, _ = flux_files["flux-dev"]
    assert describe(find_checkpoint(str(path))).resolution == describe(
        find_checkpoint(str(family_folders["flux-dev"]))).resolution


def test_diffusers_converter_still_writes_down_the_published_width():
    """What models.common.diffusers_patches' flux_single_file_widths exists for: once diffusers reads the width from
    the file, the patch goes."""
    assert "inner_dim = 3072" in inspect.getsource(convert_flux_transformer_checkpoint_to_diffusers)
