"""The app and `dwb sample` give one checkpoint and size one verdict: the app's Generate, Compare and X/Y/Z refused
nothing `dwb sample` refused (Flux.1 at 40x128 and 24, SD3 at 24x40) and `dwb sample` refused what the app drew (the
tiny SDXL at 1024, a tiny Flux.1 at its 32). And the app lists SD3 and Flux.1 diffusers folders, which have no
``unet/``."""
from __future__ import annotations

import shutil

import pytest

from app.generate import GenerationParams
from app.service import Service
from models.errors import WorkbenchError


@pytest.fixture(scope="module")
def root(family_folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in ("sdxl", "sd3", "flux-dev"):
        shutil.copytree(family_folders[name], root / name)
    shutil.copytree(family_folders["sdxl"], root / "sdxl-configs", ignore=shutil.ignore_patterns("*.safetensors"))
    return root


def params(width: int, height: int, **more) -> GenerationParams:
    return GenerationParams("a red circle", sampler="Euler", steps=1, guidance=3.0, width=width, height=height, seed=1,
                            **more)


def test_the_app_lists_sd3_and_flux_folders(root):
    """Friction 5: discovery took a folder only when it had ``unet/``; typing the path worked."""
    labels = {c.label for c in Service([root]).checkpoints()}
    assert {"sdxl", "sd3", "flux-dev"} <= labels


@pytest.mark.parametrize("name, width, height, family, step", [
    ("flux-dev", 40, 128, "Flux.1", 16), ("flux-dev", 24, 24, "Flux.1", 16),
    ("sd3", 24, 40, "Stable Diffusion 3.5", 16),
])
def test_a_size_off_the_familys_step_is_refused_by_the_app_and_by_dwb_sample(root, tmp_path, dwb, name, width,
                                                                               height, family, step):
    """Friction 6: the app drew these sizes, `dwb sample` refused them."""
    said = f"{family} draws sides that are multiples of {step}"
    service = Service([root])
    refusals = [lambda: service.generate(name, "auto", params(width, height)),
                lambda: service.compare([name, "sdxl"], "auto", params(width, height)),
                lambda: service.xyz_plot("sdxl", "auto", params(width, height), [("checkpoint", f"sdxl\n{name}"), ("none", ""), ("none", "")], 1)]
    for refused in refusals:
        with pytest.raises(WorkbenchError, match=f"^{name}: {said}; the size is {width}x{height}$"):
            refused()
    assert service.cache.stats.loads == 0  # refused before any weights are read
    r = dwb("sample", str(root / name), str(tmp_path / "x.png"), "--size", f"{width}x{height}", "--steps", "1")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == f"error: {said}; --size is {width}x{height}"


def test_a_tiny_flux_at_its_32_px_is_drawn_by_both(root, tmp_path, dwb):
    """Friction 6 the other way: `dwb sample` refused a tiny Flux.1 at the size the app drew it at."""
    drawn = Service([root]).generate("flux-dev", "auto", params(32, 32))
    assert drawn.images[0].size == (32, 32)
    r = dwb("sample", str(root / "flux-dev"), str(tmp_path / "x.png"), "--size", "32", "--steps", "1", "--seeds", "1")
    assert r.returncode == 0, r.stderr


def test_the_tiny_sdxl_at_1024_passes_the_size_rule_in_both(root, tmp_path, dwb):
    """Friction 6: the app drew the tiny SDXL at 1024, `dwb sample` refused it; both now go on to its weights (which
    this copy lacks: the same refusal in both)."""
    with pytest.raises(WorkbenchError) as app_said:
        Service([root]).generate("sdxl-configs", "auto", params(1024, 1024))
    r = dwb("sample", str(root / "sdxl-configs"), str(tmp_path / "y.png"), "--size", "1024", "--steps", "1")
    assert r.returncode != 0
    for message in (str(app_said.value), r.stderr.strip().splitlines()[-1]):
        assert "weight files in unet/ hold 0 values" in message and "multiples of" not in message
