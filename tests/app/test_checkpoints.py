"""Allowed roots: discovery, refusing paths outside them (symlinks too) before reading a byte, hashes, the LRU cache."""
import gc
import hashlib
import os
import sys
import threading
import weakref
from pathlib import Path

import pytest

from app.cache import PipelineCache
from app.checkpoints import checkpoint_hash, describe, discover, resolve_checkpoint, resolve_roots
from app.generate import GenerationParams
from app.service import Service
from train.errors import WorkbenchError

_opened: list[str] | None = None


def _audit(event: str, args) -> None:
    """Every file or folder the process opens or lists while ``_opened`` is a list."""
    if _opened is not None and event in ("open", "os.listdir", "os.scandir") and args and args[0] is not None:
        _opened.append(os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else str(args[0]))


sys.addaudithook(_audit)


def test_discovery_lists_checkpoints_and_pipelines_under_the_root(tree):
    found = discover([tree.root])
    labels = [c.label for c in found]
    assert labels == ["broken/ep0-ba9-rank0.pt", "export-ba4", "foreign/ep0-ba1-rank0.pt", "sneaky-export",
                      "tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt"]
    # the symlink to a checkpoint outside the root is not listed; latest-rank0.pt is not a second entry
    assert all(c.path.is_relative_to(tree.root) for c in found)
    assert {c.kind for c in found if c.label.startswith("export")} == {"diffusers"}


def test_natural_order_and_more_than_one_root(tree, tmp_path):
    other = tmp_path / "more"
    (other / "run").mkdir(parents=True)
    for n in (10, 9, 100):
        (other / "run" / f"ep0-ba{n}-rank0.pt").write_bytes(b"x")
    found = discover(resolve_roots([tree.root, other]))
    mine = [c.label for c in found if c.label.startswith("more/")]
    assert mine == ["more/run/ep0-ba9-rank0.pt", "more/run/ep0-ba10-rank0.pt", "more/run/ep0-ba100-rank0.pt"]
    assert "checkpoints/tiny-phase1/ep0-ba4-rank0.pt" in [c.label for c in found]


def test_paths_inside_the_root_are_accepted_absolute_or_relative(tree):
    roots = [tree.root]
    assert resolve_checkpoint(str(tree.ba4), roots).path == tree.ba4
    assert resolve_checkpoint("tiny-phase1/ep0-ba4-rank0.pt", roots).path == tree.ba4
    assert resolve_checkpoint("tiny-phase1/latest-rank0.pt", roots).path == tree.ba4  # a link inside the root
    assert resolve_checkpoint(f"{tree.root}/tiny-phase1/../export-ba4", roots).kind == "diffusers"


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


def test_corrupt_and_foreign_checkpoints_are_refused_with_their_name(tree):
    service = Service([tree.root], cache_size=1)
    p = GenerationParams("a red circle", steps=2, width=16, height=16)
    with pytest.raises(WorkbenchError, match="cannot read checkpoint .*ep0-ba9-rank0.pt: corrupt or not a PyTorch file"):
        service.generate(str(tree.broken), "ema", p)
    with pytest.raises(WorkbenchError, match="ep0-ba1-rank0.pt is not a diffusion-workbench checkpoint"):
        service.generate(str(tree.foreign), "raw", p)
    assert len(service.cache) == 0


def test_describe_reads_resolution_and_ema(tree):
    info = describe(resolve_checkpoint(str(tree.ba4), [tree.root]))
    assert (info.kind, info.resolution, info.has_ema, info.architecture) == ("composer", 16, True, "tiny")
    folder = describe(resolve_checkpoint(str(tree.export), [tree.root]))
    # a diffusers folder does not record its training resolution: its UNet's sample size (8) x VAE factor (4)
    assert (folder.kind, folder.resolution, folder.has_ema) == ("diffusers", 32, None)


def test_checkpoint_hash_is_the_files_sha256_and_follows_rewrites(tree, tmp_path):
    ckpt = resolve_checkpoint(str(tree.ba2), [tree.root])
    assert checkpoint_hash(ckpt) == hashlib.sha256(tree.ba2.read_bytes()).hexdigest()
    folder = resolve_checkpoint(str(tree.export), [tree.root])
    unet = tree.export / "unet" / "diffusion_pytorch_model.safetensors"
    assert checkpoint_hash(folder) == hashlib.sha256(unet.read_bytes()).hexdigest()
    # a rewritten file (new mtime and size) is hashed again, not served from the cache
    f = tmp_path / "ep0-ba1-rank0.pt"
    f.write_bytes(b"first")
    one = checkpoint_hash(resolve_checkpoint(str(f), [tmp_path]))
    f.write_bytes(b"second version")
    assert checkpoint_hash(resolve_checkpoint(str(f), [tmp_path])) == hashlib.sha256(b"second version").hexdigest() != one


def test_pipeline_cache_is_lru_and_frees_evicted_pipelines(tree):
    service = Service([tree.root], cache_size=2)
    a = service.pipeline(service.open(str(tree.ba2)), "ema")
    assert service.pipeline(service.open(str(tree.ba2)), "ema") is a  # the second load is the cached one
    b = service.pipeline(service.open(str(tree.ba4)), "ema")
    assert service.pipeline(service.open(str(tree.ba2)), "ema") is a  # a is now the most recently used
    unet_b = weakref.ref(b.unet)
    del b
    service.pipeline(service.open(str(tree.export)), "ema")  # evicts b, the least recently used
    gc.collect()
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
