"""Allowed roots: discovery, refusing paths outside them (symlinks too) before reading a byte, hashes, the LRU cache."""
import os
import shutil
import sys
import threading
import weakref
from pathlib import Path

import pytest

from app.cache import PipelineCache
from models.checkpoints import Checkpoint, content_hash, describe, discover, find_checkpoint, resolve_roots
from app.generate import GenerationParams
from app.service import Service
from models.errors import WorkbenchError

_opened: list[str] | None = None


def _audit(event: str, args) -> None:
    """Every file or folder the process opens or lists while ``_opened`` is a list."""
    if _opened is not None and event in ("open", "os.listdir", "os.scandir") and args and args[0] is not None:
        _opened.append(os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else str(args[0]))


sys.addaudithook(_audit)


def test_discovery_lists_the_checkpoints_and_pipelines_under_the_root(tree):
    found = discover([tree.root])
    labels = [c.label for c in found]
    # broken and foreign files are not checkpoints; the symlink to a checkpoint outside the root is not listed, nor
    # the export whose UNet weights link outside it, and latest-rank0.pt is not a second entry
    assert labels == ["export-ba4", "tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt"]
    assert all(c.path.is_relative_to(tree.root) for c in found)
    assert [(c.kind, c.step) for c in found] == [("diffusers", None), ("composer", 2), ("composer", 4)]


def test_natural_order_and_more_than_one_root(tree, tmp_path):
    other = tmp_path / "more"
    (other / "run").mkdir(parents=True)
    for n in (10, 9, 100):
        shutil.copy(tree.ba2, other / "run" / f"ep0-ba{n}-rank0.pt")
    roots = resolve_roots([tree.root, other])
    found = discover(roots)
    mine = [c.label for c in found if c.label.startswith("more/")]
    assert mine == ["more/run/ep0-ba9-rank0.pt", "more/run/ep0-ba10-rank0.pt", "more/run/ep0-ba100-rank0.pt"]
    assert "checkpoints/tiny-phase1/ep0-ba4-rank0.pt" in [c.label for c in found]
    assert find_checkpoint("more/run/ep0-ba10-rank0.pt", roots=roots).path == other / "run" / "ep0-ba10-rank0.pt"


def test_paths_inside_the_root_are_accepted_absolute_or_relative(tree):
    roots = [tree.root]
    assert find_checkpoint(str(tree.ba4), roots=roots).path == tree.ba4
    assert find_checkpoint("tiny-phase1/ep0-ba4-rank0.pt", roots=roots).path == tree.ba4
    assert find_checkpoint("tiny-phase1/latest-rank0.pt", roots=roots).path == tree.ba4  # a link inside the root
    assert find_checkpoint(f"{tree.root}/tiny-phase1/../export-ba4", roots=roots).kind == "diffusers"


@pytest.mark.parametrize("name, message", [
    ("outside_abs", "is outside the allowed checkpoint folders"),
    ("dotdot", "is outside the allowed checkpoint folders"),
    ("linked", "is outside the allowed checkpoint folders"),
    ("sneaky", "links to unet/diffusion_pytorch_model.safetensors outside the allowed checkpoint folders"),
    ("etc", "is outside the allowed checkpoint folders"),
    ("url", "not a local path"),
    ("missing", "checkpoint not found"),
])
def test_paths_outside_the_root_are_refused_without_reading_them(tree, name, message):
    global _opened
    text = {"outside_abs": str(tree.outside / "ep0-ba4-rank0.pt"),
            "dotdot": "../outside/ep0-ba4-rank0.pt",
            "linked": str(tree.linked),
            "sneaky": str(tree.sneaky),
            "etc": "/etc/passwd",
            "url": "s3://bucket/ep0-ba4-rank0.pt",
            "missing": "tiny-phase1/ep9-ba999-rank0.pt"}[name]
    service = Service([tree.root], cache_size=1)
    _opened = []
    try:
        for call in (lambda: service.info(text),
                     lambda: service.generate(text, "ema", GenerationParams("a red circle", steps=2, width=16, height=16))):
            with pytest.raises(WorkbenchError, match=message):
                call()
    finally:
        touched, _opened = _opened, None
    assert not [p for p in touched if p.startswith(str(tree.outside)) or p.startswith("/etc")]
    assert len(service.cache) == 0


def test_messages_name_no_server_folder_and_tell_nothing_of_files_outside_the_roots(tree, monkeypatch):
    """A hub id missing from the cache named the cache's folder; a relative path out of the roots, or one relative
    to the server's working folder, got another message when it existed there than when it did not."""
    from models.checkpoints.hub import hub_cache

    service = Service([tree.root])

    def message(text: str) -> str:
        with pytest.raises(WorkbenchError) as e:
            service.open(text)
        shown = str(e.value)
        assert "\n" not in shown and str(hub_cache()) not in shown and str(tree.root.parent) not in shown, shown
        return shown.replace(text, "NAME").split("; the app's checkpoints: ")[0]  # those listed, nearest the text first

    assert message("nobody/nothing") == ("checkpoint not found: NAME (not under the allowed folders, nor a pipeline "
                                         "in the server's Hugging Face cache)")
    up = "../" * (len(tree.root.parts) - 1)
    monkeypatch.chdir(tree.outside.parent)  # the server's working folder holds outside/ and checkpoints/
    for there, not_there in (("../outside/ep0-ba4-rank0.pt", "../outside/ep0-ba5-rank0.pt"),
                             ("../outside/export", "../outside/exported"), (f"{up}etc/passwd", f"{up}etc/passwords"),
                             ("outside/export", "outside/exported"), ("outside/ep0-ba4-rank0.pt", "outside/ba5.pt")):
        assert message(there) == message(not_there), there


def test_a_name_that_names_no_checkpoint_gets_the_names_there_are(tree, tmp_path):
    """A label that resolves to nothing, or to a folder of checkpoints, named a file (model_index.json); now the
    message lists the checkpoints there are, the nearest first, a few of them and how many more."""
    (tmp_path / "run").mkdir()
    for n in range(1, 8):
        os.link(tree.ba2, tmp_path / "run" / f"ep0-ba{n}-rank0.pt")
    service = Service([tmp_path])
    known = ("the app's checkpoints: run/ep0-ba1-rank0.pt, run/ep0-ba2-rank0.pt, run/ep0-ba3-rank0.pt, "
             "run/ep0-ba4-rank0.pt, run/ep0-ba5-rank0.pt and 2 more")
    for text, shown in (("run/ep0-ba9-rank0.pt", "run/ep0-ba9-rank0.pt"), ("run", "run (a folder, not a checkpoint)"),
                        (str(tmp_path / "run"), "run (a folder, not a checkpoint)")):
        with pytest.raises(WorkbenchError) as e:
            service.open(text)
        assert str(e.value) == f"checkpoint not found: {shown}; {known}"
    with pytest.raises(WorkbenchError, match=r"^checkpoint not found: export-ba5; the app's checkpoints: export-ba4, "):
        Service([tree.root]).open("export-ba5")  # the nearest name first


def test_corrupt_and_foreign_checkpoints_are_refused_by_label_without_server_paths(tree):
    service = Service([tree.root], cache_size=1)
    p = GenerationParams("a red circle", steps=2, width=16, height=16)
    for text, message in ((str(tree.broken), "broken/ep0-ba9-rank0.pt: corrupt, not a PyTorch file"),
                          ("foreign/ep0-ba1-rank0.pt", "foreign/ep0-ba1-rank0.pt is not a Composer checkpoint")):
        with pytest.raises(WorkbenchError, match=message) as raised:
            service.generate(text, "ema", p)
        assert str(tree.root) not in str(raised.value)  # the server's folders stay its own
    assert len(service.cache) == 0


def test_describe_reads_resolution_and_ema(tree):
    info = describe(find_checkpoint(str(tree.ba4), roots=[tree.root]))
    assert (info.kind, info.resolution, info.has_ema, info.architecture) == ("composer", 16, True, "tiny")
    folder = describe(find_checkpoint(str(tree.export), roots=[tree.root]))
    # a diffusers folder does not record its training resolution: its UNet's sample size (8) x VAE factor (4)
    assert (folder.kind, folder.resolution, folder.has_ema) == ("diffusers", 32, None)


def test_content_hash_names_the_content_not_the_file(tree, tmp_path):
    ba2, ba4 = (find_checkpoint(str(p), roots=[tree.root]) for p in (tree.ba2, tree.ba4))
    assert content_hash(ba2) != content_hash(ba4) and len(content_hash(ba2)) == 12
    renamed = tmp_path / "my-favourite.pt"
    shutil.copy(tree.ba2, renamed)
    assert content_hash(find_checkpoint(renamed)) == content_hash(ba2)  # the same bytes under another name
    # a file rewritten with other weights is hashed again, not served from the cache
    shutil.copy(tree.ba4, renamed)
    assert content_hash(Checkpoint(str(renamed), "composer", "renamed", renamed)) == content_hash(ba4)
    folder = find_checkpoint(str(tree.export), roots=[tree.root])
    copy = tmp_path / "export-copy"
    shutil.copytree(tree.export, copy)
    assert content_hash(find_checkpoint(copy)) == content_hash(folder)
    unet = copy / "unet" / "diffusion_pytorch_model.safetensors"
    weights = bytearray(unet.read_bytes())
    weights[-100] ^= 0x01  # one of the UNet's last weights
    unet.write_bytes(bytes(weights))
    assert content_hash(find_checkpoint(copy)) != content_hash(folder)


def test_pipeline_cache_is_lru_and_frees_evicted_pipelines(tree):
    service = Service([tree.root], cache_size=2)
    a = service.pipeline(service.open(str(tree.ba2)), "ema")
    assert service.pipeline(service.open(str(tree.ba2)), "ema") is a  # the second load is the cached one
    b = service.pipeline(service.open(str(tree.ba4)), "ema")
    assert service.pipeline(service.open(str(tree.ba2)), "ema") is a  # a is now the most recently used
    unet_b = weakref.ref(b.unet)
    del b
    alive_while_loading = []
    load = service.cache.get

    def get(key, loader):  # the cache's get, noting whether b still lives while the new pipeline loads
        return load(key, lambda: (alive_while_loading.append(unet_b() is not None), loader())[1])

    service.cache.get = get
    service.pipeline(service.open(str(tree.export)), "ema")  # evicts b, the least recently used
    assert alive_while_loading == [False]  # b's memory was handed back before the new one loaded
    del service.cache.get
    assert unet_b() is None  # its memory is gone, not just its cache entry
    assert service.cache.stats.loads == 3 and service.cache.stats.evictions == 1 and service.cache.stats.hits == 2
    raw = service.pipeline(service.open(str(tree.ba2)), "raw")
    assert raw is not a  # EMA and raw weights are different entries


def test_concurrent_requests_for_one_checkpoint_load_it_once():
    cache, calls, barrier = PipelineCache(2), [], threading.Barrier(4)

    def load():
        calls.append(1)
        threading.Event().wait(0.2)
        return object()

    results = []

    def worker():
        barrier.wait()
        results.append(cache.get("k", load))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(r) for r in results}) == 1 and cache.stats.hits == 3


def test_roots_must_exist(tmp_path):
    with pytest.raises(WorkbenchError, match="checkpoint folder not found"):
        resolve_roots([tmp_path / "nope"])
    assert resolve_roots([tmp_path, Path(tmp_path, ".")]) == [tmp_path.resolve()]


def test_output_folder_keeps_every_png_with_its_parameters(tree, tmp_path):
    from PIL import Image

    service = Service([tree.root], cache_size=1, output=tmp_path / "out")
    result = service.generate("tiny-phase1/ep0-ba4-rank0.pt", "raw",
                              GenerationParams("a red circle", steps=2, width=16, height=16, seed=30, batch_size=2))
    files = sorted((tmp_path / "out").rglob("*.png"))
    assert [f.name.split("-")[-1] for f in files] == ["30.png", "31.png"]
    for f, image, record in zip(files, result.images, result.records):
        with Image.open(f) as saved:
            assert saved.text["parameters"] == record.parameters() == image.info["parameters"]
            assert saved.tobytes() == image.tobytes()
