"""Fixtures for human_eval: sample sets written the way `evaluate` writes them, and a real server process.

Every image carries its generator's settings in PNG text chunks (model, checkpoint, scheduler), the
way diffusion front-ends write them, so tests can check that none of it reaches a rater.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from ..conftest import DWB, PROMPT_SETS, REPO
from ..servers import ServerProcess, free_port

DRAWBENCH = PROMPT_SETS / "drawbench.csv"


def model_secrets(name: str) -> dict:
    """The identifying strings of one synthetic model; none may appear in a rater-facing byte."""
    return {"model": f"{name}-modelname-7f3c", "checkpoint": f"/ckpts/{name}-secretckpt-91ab/ep3-ba800k-rank0.pt",
            "scheduler": f"{name}SecretSchedulerXq", "checkpoint_hash": f"c0ffee{name.encode().hex()[:10]}"}


def write_samples(folder: Path, name: str, prompts: list[tuple[str, str]], images_per_prompt: int = 1,
                  size: int = 32, seed: int = 0, absolute: bool = False, first_index: int = 0) -> Path:
    """A manifest.jsonl with one PNG per prompt and image index; returns the manifest's path.

    `prompts` are rows `first_index`, `first_index` + 1, ... of a prompt list (their prompt_index).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "samples").mkdir(exist_ok=True)
    ids = model_secrets(name)
    rng = np.random.default_rng(seed)
    lines = []
    for i, (prompt, category) in enumerate(prompts, start=first_index):
        for k in range(images_per_prompt):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            info = PngImagePlugin.PngInfo()
            info.add_text("parameters", f"{prompt}; model: {ids['model']}; checkpoint: {ids['checkpoint']}; "
                                        f"scheduler: {ids['scheduler']}; seed: {1000 + k}")
            info.add_itxt("Software", f"diffusion-workbench {ids['model']}")
            path = folder / "samples" / f"{i:04d}_{k}.png"
            Image.fromarray(pixels).save(path, pnginfo=info)
            lines.append({"prompt": prompt, "prompt_index": i, "category": category, "image_index": k, "seed": 1000 + k,
                          "checkpoint": ids["checkpoint"], "model": ids["model"], "guidance": 7.5,
                          "sampler": ids["scheduler"], "steps": 50, "width": size, "height": size,
                          "path": str(path) if absolute else f"samples/{path.name}", "checkpoint_hash": ids["checkpoint_hash"],
                          "clip_score": round(float(pixels.mean()) / 255, 4)})
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def photo_like(rng: np.random.Generator, size: int) -> np.ndarray:
    """(size, size, 3) uint8: smooth light, a few hard-edged objects and film grain of random strength.

    Like generated images, these differ in how much detail (and so how many PNG bytes) they hold.
    """
    yy, xx = np.mgrid[0:size, 0:size] / size
    light = rng.uniform(0, 255, (3, 3))
    pixels = light[:, 0] + np.multiply.outer(xx, light[:, 1] - light[:, 0]) + np.multiply.outer(yy, light[:, 2] - 128) / 2
    for _ in range(rng.integers(1, 6)):
        cx, cy, r = rng.uniform(0, 1, 3) * (1, 1, 0.4)
        inside = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
        pixels[inside] = rng.uniform(0, 255, 3)
    pixels += rng.normal(0, rng.uniform(0, 24), pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def drawbench(n: int | None = None) -> list[tuple[str, str]]:
    from human_eval.samples import read_prompts

    prompts = read_prompts("drawbench")
    return prompts if n is None else prompts[:n]


def start_rater(client: httpx.Client, label: str | None = None) -> str:
    """Start a new rater as the page does; the client then sends the rater's key with every request."""
    r = client.post("/api/session", json={"rater": label})
    assert r.status_code == 200, r.text
    client.headers["X-Rater-Key"] = r.json()["key"]
    return r.json()["rater"]


def cookie_attributes(set_cookie: str) -> dict[str, str]:
    """A Set-Cookie header's value and attributes, attribute names in lower case ('' for flags such as secure)."""
    first, *attributes = (part.strip() for part in set_cookie.split(";"))
    return {"value": first.split("=", 1)[1], **{k.lower(): v for k, _, v in (a.partition("=") for a in attributes)}}


class Server(ServerProcess):
    """`dwb human-eval serve STUDY --admin-token TOKEN EXTRA...` on 127.0.0.1, ready when /healthz answers
    (``token=None``: no --admin-token, so the server takes it from the environment or the study's file)."""

    def __init__(self, study: Path, *extra: str, port: int | None = None, token: str | None = "admin-secret-token",
                 env: dict | None = None):
        self.study, self.token = study, token
        port = port or free_port()
        token_args = ["--admin-token", token] if token is not None else []
        super().__init__([DWB, "human-eval", "serve", study, "--port", port, *token_args, *extra], port=port,
                         ready_path="/healthz", cwd=REPO, env=env)


@pytest.fixture(scope="module")
def two_model_study(tmp_path_factory) -> Path:
    """Two models on 12 DrawBench prompts x 2 images, with 2 gold and 2 repeated pairs (28 pairs)."""
    from human_eval.samples import read_manifest
    from human_eval.study import build_study

    root = tmp_path_factory.mktemp("two")
    prompts = drawbench(12)
    samples = read_manifest(write_samples(root / "alpha", "alpha", prompts, 2, seed=1))
    samples += read_manifest(write_samples(root / "beta", "beta", prompts, 2, seed=2))
    build_study(samples, root / "study", gold=2, repeats=2, seed=0, progress=False)
    return root / "study"
