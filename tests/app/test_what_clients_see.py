"""What a new user meets in `dwb app`: a diffusers folder given itself to --checkpoints (docs/app.md's own
command) opens under the label the app lists, and no message a client sees names a server path."""
import re

import httpx
import pytest
from PIL import Image

from app.generate import GenerationParams
from app.handlers import Handlers
from app.service import Service

from ..conftest import file_size_limit
from .conftest import AppServer


def dropdown_value(url: str, elem_id: str):
    """The value a component starts with, as Gradio's config sends it to the browser."""
    config = httpx.get(f"{url}/config", timeout=30).json()
    return next(c["props"]["value"] for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id)


def test_a_pipeline_folder_given_to_checkpoints_is_preselected_and_generates(tree, tmp_path):
    from gradio_client import Client

    app = AppServer([tree.root / "tiny-phase1", tree.export], log=tmp_path / "app.log")
    app.launch()
    try:
        app.wait_ready()
        chosen = dropdown_value(app.url, "checkpoint")
        assert chosen == tree.export.name  # the newest: the folder listed under its own name
        client = Client(app.url, verbose=False, download_files=str(tmp_path))
        gallery, text = client.predict(checkpoint=chosen, weights="auto", prompt="a red circle", negative_prompt="",
                                       sampler="DPM++ 2M", steps=2, guidance_scale=3.0, width=16, height=16, seed=1,
                                       batch_size=1, api_name="/generate")
        with Image.open(gallery[0]["image"]) as image:
            assert image.size == (16, 16) and f"Model: {chosen}" in image.text["parameters"]
    finally:
        app.stop()


class Quiet:
    """What a Gradio event gets for its request and progress outside a server."""
    session_hash = "test"

    def __call__(self, *args, **kwargs):
        pass


def generate_message(handlers: Handlers, checkpoint: str) -> str:
    with pytest.raises(Exception) as refused:
        handlers.generate(checkpoint, "auto", "a red circle", "", "DPM++ 2M", 2, 3.0, 16, 16, 1, 1,
                          request=Quiet(), progress=Quiet())
    return refused.value.message


def names_no_server_path(message: str, *folders) -> bool:
    return "\n" not in message and not any(str(f) in message for f in folders) and not re.search(r"(^|\s)/\w", message)


def test_a_library_error_naming_server_paths_reaches_the_client_without_them(tree, monkeypatch):
    import models.checkpoints

    def library_error(ckpt, **kw):  # as diffusers words a file it cannot read: by its absolute path
        raise OSError(f"Error no file named config.json found in directory {tree.export}/unet "
                      f"(cache {tree.outside}/hub/models--x)")

    monkeypatch.setattr(models.checkpoints, "load_pipeline", library_error)
    message = generate_message(Handlers(Service([tree.root], cache_size=1)), tree.export.name)
    assert message.startswith(f"cannot load {tree.export.name}: OSError: ")
    assert names_no_server_path(message, tree.root, tree.outside), message


def test_a_full_disk_under_output_is_told_without_its_server_path(tree, tmp_path):
    service = Service([tree.root], cache_size=1, output=tmp_path / "srv" / "outputs")
    service.generate(tree.export.name, "auto", GenerationParams("warm", steps=1, width=16, height=16, seed=1))
    handlers = Handlers(service)
    with file_size_limit(64):  # no PNG of 16 x 16 px with its parameters fits
        message = generate_message(handlers, tree.export.name)
    assert message.startswith("the disk is full under --output/") and "not written" in message
    assert names_no_server_path(message, tree.root, tmp_path), message
