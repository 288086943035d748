"""`dwb app` with SDXL, SD3 and Flux.1 folders among its checkpoints: each generates through Gradio's API, its
PNG parameters naming it; a sampler the family cannot use is one line to the client."""
from __future__ import annotations

import shutil

import pytest
from PIL import Image

from ..app.conftest import AppServer


@pytest.mark.slow
def test_the_app_generates_from_each_family(family_folders, tmp_path):
    from gradio_client import Client

    root = tmp_path / "models"
    for name in ("sdxl", "sd3", "flux-schnell"):
        shutil.copytree(family_folders[name], root / name)
    app = AppServer([root], log=tmp_path / "app.log")
    app.launch()
    try:
        app.wait_ready()
        client = Client(app.url, verbose=False, download_files=str(tmp_path))
        for name, (width, height) in (("sdxl", (48, 32)), ("sd3", (32, 64)), ("flux-schnell", (64, 32))):  # any aspect
            gallery, _ = client.predict(checkpoint=name, weights="auto", prompt="a red circle", negative_prompt="",
                                        sampler="Euler", steps=2, guidance_scale=3.0, width=width, height=height,
                                        seed=1, batch_size=1, api_name="/generate")
            with Image.open(gallery[0]["image"]) as image:
                assert image.size == (width, height) and f"Model: {name}" in image.text["parameters"]
                assert f"Size: {width}x{height}" in image.text["parameters"]
        with pytest.raises(Exception, match="Flux.1 cannot be sampled with 'LMS'; choose one of: Euler"):
            client.predict(checkpoint="flux-schnell", weights="auto", prompt="a red circle", negative_prompt="",
                           sampler="LMS", steps=2, guidance_scale=3.0, width=32, height=32, seed=1, batch_size=1,
                           api_name="/generate")
    finally:
        app.stop()


def test_the_generate_tab_offers_what_the_chosen_family_takes(family_folders, tiny_run, tmp_path):
    """Choosing a checkpoint sets the sampler list to its family's (keeping a choice that fits) and disables the
    negative prompt where the family has none: the app never offers what the family cannot use."""
    from app.handlers import Handlers
    from app.service import Service
    from models.families import family_named

    root = tmp_path / "models"
    for name in ("sd3", "flux-dev"):
        shutil.copytree(family_folders[name], root / name)
    handlers = Handlers(Service([root, tiny_run]))
    sampler, negative = handlers.family_controls("flux-dev", "LMS")
    assert list(sampler["choices"]) == list(family_named("flux").samplers)
    assert sampler["value"] == "DPM++ 2M" and negative["interactive"] is False
    assert "Flux.1 has no negative prompt" in negative["placeholder"]
    sampler, negative = handlers.family_controls("sd3", "Heun")
    assert sampler["value"] == "Heun" and "LMS" not in list(sampler["choices"]) and negative["interactive"] is True
    ours = next(label for label in handlers.choices()[1] if label.endswith(".pt"))  # one of this workbench's own
    sampler, _ = handlers.family_controls(ours, "LMS")
    assert sampler["value"] == "LMS" and "DDIM" in list(sampler["choices"])
