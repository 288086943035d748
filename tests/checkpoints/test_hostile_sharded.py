"""Hostile sharded checkpoints (``fsdp_state_dict_type: sharded``) as the app's listing and autoresume meet them
(`dwb sample` reads a folder as the listing does): an index whose BUILD opcodes set attributes of pathlib's or DCP's
own classes, a value whose zip inflates to 3 GiB, a sparse 6 GiB part whose one value claims all of it, an index of
millions of objects, an index whose keys all hash alike. Each is refused in one line, under a memory cap, and the
process is left as it was: its containment and link checks still refuse."""
from __future__ import annotations

import functools
import json
import pickle
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import pytest
import torch

from ..conftest import REPO
from ..train.test_sharded_checkpoints import copy_of, rewrite_index, write_sharded
from .test_hostile_checkpoints import _pickle_of, deflated, with_pickle_replaced

MiB = 1 << 20
CAP = 3 * 1024 * MiB // 2  # bytes of data memory (RLIMIT_DATA) the attacks run under: a 3 GiB allocation fails
DCP = "torch.distributed.checkpoint.metadata"


def _text(value: str) -> bytes:
    raw = value.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def setting_attributes(target: bytes, values: dict[str, bytes]) -> bytes:
    """An index that puts ``target`` on the stack and BUILDs it with the state ``(None, {name: value})``: pickle then
    calls ``setattr(target, name, value)`` for each, whatever the target is, a class included."""
    items = b"".join(_text(name) + value for name, value in values.items())
    return (pickle.PROTO + b"\x04" + target + pickle.NONE + pickle.EMPTY_DICT + pickle.MARK + items + pickle.SETITEMS
            + pickle.TUPLE2 + pickle.BUILD + pickle.STOP)


POISONED = {
    # the index: every containment check passes and every link check fails, for the whole process
    "pathlib": setting_attributes(_global("pathlib", "PosixPath"), {
        "is_relative_to": _global("pathlib", "PosixPath"), "relative_to": _global("pathlib", "PurePosixPath"),
        "is_symlink": _global("torch", "Size")}),
    # a default of DCP's own record class, which every index read after it would hold
    "record-class": setting_attributes(_global(DCP, "Metadata"), {"planner_data": _text("poisoned")}),
    # the cache PyTorch's _get_layout keeps on itself: torch.strided would read as a dtype
    "layout-cache": setting_attributes(_global("torch.serialization", "_get_layout"), {
        "cache": pickle.EMPTY_DICT + _text("torch.strided") + _global("torch", "float64") + pickle.SETITEM}),
    # a member of DCP's memory-format enum, which every index shares
    "enum-member": setting_attributes(_global(DCP, "_MEM_FORMAT_ENCODING") + pickle.BININT1 + b"\x00" + pickle.TUPLE1
                                      + pickle.REDUCE, {"_value_": pickle.BININT1 + b"\x02"}),
}


def write_poisoned(folder: Path, name: str = "pathlib") -> Path:
    """A "sharded checkpoint" folder whose index is ``POISONED[name]`` (the folder needs nothing else to be listed)."""
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(POISONED[name])
    return folder


def with_value_at(folder: Path, fqn: str, part: str, offset: int, length: int) -> Path:
    """The folder with its index pointing the value ``fqn`` at ``length`` bytes of ``part`` from ``offset``."""
    def repoint(meta):
        for index, info in meta.storage_data.items():
            if index.fqn == fqn:
                info.relative_path, info.offset, info.length = part, offset, length

    rewrite_index(folder, repoint)
    return folder


@functools.cache
def value_bomb() -> bytes:
    """A 3 MiB ``torch.save`` zip of a string whose deflated ``data.pkl`` inflates to 3 GiB (made once: its CRC-32
    runs over the 3 GiB)."""
    with tempfile.TemporaryDirectory() as scratch:
        value = Path(scratch) / "value.pt"
        torch.save("a run name", value)
        raw, crc, size = deflated(_pickle_of(value), 3 * 1024)
        return with_pickle_replaced(value, Path(scratch) / "bomb.pt", raw, crc, size).read_bytes()


def write_value_bomb(sharded: Path, out: Path, fqn: str = "state.run_name") -> Path:
    """A copy of ``sharded`` whose non-tensor value ``fqn`` is ``value_bomb()``, appended to its part (the issue's
    F7)."""
    folder = Path(shutil.copytree(sharded, out))
    part, bomb = folder / "__0_0.distcp", value_bomb()
    offset = part.stat().st_size
    with open(part, "ab") as f:
        f.write(bomb)
    return with_value_at(folder, fqn, part.name, offset, len(bomb))


def write_hostile_sharded(root: Path, sharded: Path) -> dict[str, Path]:
    """Under ``root``: the issue's poisoned index (pathlib's, 123 bytes) and F7's folder (a value inflating to
    3 GiB)."""
    return {"poisoned": write_poisoned(root / "poisoned" / "ep0-ba1"),
            "value-bomb": write_value_bomb(sharded, root / "value-bomb" / "ep0-ba9")}


@pytest.fixture(scope="module")
def sharded(tiny_run, tmp_path_factory) -> Path:
    return write_sharded(tiny_run / "ep0-ba4-rank0.pt", tmp_path_factory.mktemp("sharded") / "ep0-ba4")


# What the app does when it starts (lists its folders: every index read), then what a request asks of the door;
# autoresume over a run folder; all in one process held to CAP, which prints what it saw as JSON.
LISTING = r"""
import json, logging, pathlib, resource, sys
resource.setrlimit(resource.RLIMIT_DATA, (int(sys.argv[4]), int(sys.argv[4])))
root, outside, run = (pathlib.Path(a) for a in sys.argv[1:4])
from models.checkpoints import discover, find_checkpoint, select_resume_checkpoint

said = []

class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())

logging.getLogger().addHandler(Said())
listed = [c.label for c in discover([root])]

def refusal(ref):
    try:
        find_checkpoint(ref, roots=[root])
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "found"

door = {"outside": refusal(str(outside)), "etc": refusal("/etc"), "missing": refusal("/no-such-folder"),
        "linked": refusal("linked")}
import torch
from torch.distributed.checkpoint.metadata import Metadata, _MEM_FORMAT_ENCODING
from torch.serialization import _get_layout
kept = {"pathlib": "is_relative_to" not in vars(pathlib.PosixPath) and not pathlib.Path("/etc").is_relative_to(root)
                   and pathlib.Path(root / "linked" / "model.safetensors").is_symlink(),
        "record-class": Metadata.planner_data is None,
        "layout-cache": _get_layout("torch.strided") is torch.strided,
        "enum-member": _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT.value == 0}
resumed = select_resume_checkpoint(run)
print(json.dumps(dict(listed=listed, said=said, door=door, kept=kept, resumed=resumed and resumed.name,
                      run=sorted(p.name for p in run.iterdir()))))
"""


@pytest.fixture(scope="module")
def listing(tiny_run, sharded, tmp_path_factory) -> dict:
    """The hostile folders listed, the door asked and autoresume run, in one process held to ``CAP``."""
    base = tmp_path_factory.mktemp("hostile-sharded")
    root, outside, run = base / "checkpoints", base / "outside" / "ep0-ba4-rank0.pt", base / "run" / "checkpoints"
    for name in POISONED:
        write_poisoned(root / f"poisoned-{name}", name)
    write_value_bomb(sharded, root / "value-bomb")
    sparse = Path(shutil.copytree(sharded, root / "sparse-value"))
    with open(sparse / "__1_0.distcp", "wb") as f:  # 6 GiB on disk, no block of it written
        f.truncate(6 << 30)
    with_value_at(sparse, "state.run_name", "__1_0.distcp", 0, 6 << 30)
    outside.parent.mkdir()
    shutil.copy2(tiny_run / "ep0-ba4-rank0.pt", outside)
    (root / "linked").mkdir()
    (root / "linked" / "model.safetensors").symlink_to(outside)
    write_value_bomb(sharded, run / "ep0-ba9")
    done = subprocess.run([sys.executable, "-c", LISTING, str(root), str(outside), str(run), str(CAP)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def not_listed(listing: dict, label: str) -> str:
    """The one line the listing said about ``label``."""
    [line] = [line for line in listing["said"] if line.startswith("not listed: ") and f" {label}" in line]
    return line


def test_an_index_cannot_change_pathlib_or_any_class_it_names(listing):
    """Pickle's BUILD opcode sets attributes of whatever is on the stack: a 138-byte index naming
    ``pathlib.PosixPath`` set ``is_relative_to`` (always true), ``relative_to`` and ``is_symlink`` (always false)
    for the whole process, then was refused as "not a DCP index", the change kept. In the app's server process every
    containment check then passed and every link check failed. Each such index is refused here in one line naming
    it, and pathlib, DCP's classes, its enum and PyTorch's layout cache are as they were."""
    for name in POISONED:
        reason = not_listed(listing, f"poisoned-{name}")
        assert "\n" not in reason, reason
        assert "would set attributes" in reason, (name, reason)
    assert listing["kept"] == {name: True for name in POISONED}
    door = listing["door"]
    assert door["outside"].endswith("is outside the allowed checkpoint folders"), door
    assert door["linked"].endswith("linked links to model.safetensors outside the allowed checkpoint folders"), door
    # whether /etc exists changes nothing in the answer
    assert door["etc"].replace("/etc", "PATH") == door["missing"].replace("/no-such-folder", "PATH"), door


def test_a_value_that_inflates_to_3_gib_is_refused_by_the_listing_and_autoresume_in_1_5_gib(listing):
    """A 3 MiB non-tensor value (``state.run_name``) whose ``torch.save`` zip holds a deflated ``data.pkl`` that
    inflates to 3 GiB: non-tensor values skipped the stored-only check and ``torch.load`` inflated it (the listing,
    `dwb sample` and autoresume passed 3 GiB in 27 s). Under 1.5 GiB of data memory it is refused in one line before
    anything inflates; autoresume sets the folder aside (``*.corrupt``) and resumes from none."""
    reason = not_listed(listing, "value-bomb")
    assert "\n" not in reason and "state.run_name" in reason, reason
    assert "compressed" in reason and "MemoryError" not in reason, reason
    assert listing["resumed"] is None and listing["run"] == ["ep0-ba9.corrupt"]
    assert listing["listed"] == []  # nothing under the root is a checkpoint that reads


def test_a_value_declared_as_a_whole_sparse_6_gib_part_is_refused_before_it_is_read(listing):
    """A part of 6 GiB on disk (sparse: no block written) and ``state.run_name`` declared as all of it: the value was
    read into memory whole, no bound per value. Refused from the index alone, within 1.5 GiB."""
    reason = not_listed(listing, "sparse-value")
    assert "\n" not in reason and "state.run_name" in reason, reason
    assert f"{6 << 30:,} bytes" in reason and "MemoryError" not in reason, reason


def test_an_index_of_millions_of_objects_is_refused_within_its_object_budget(sharded, tmp_path, monkeypatch):
    """The byte limit did not bound the objects: a 240 MiB index (under the 256 MiB limit) of 34M entries took
    unpickling past 3 GiB. What an index builds is counted and held to 8 bytes per byte of the same limit; here, at
    1/256 of the default (8 MiB), a 1 MiB index of a million empty dicts (72 MB as pickle builds them) is refused
    within it."""
    from models.checkpoints import read_checkpoint
    from models.readers.sharded import MAX_INDEX_ENV
    from models.errors import CheckpointError

    folder = copy_of(sharded, tmp_path)
    (folder / ".metadata").write_bytes(pickle.PROTO + b"\x04" + pickle.EMPTY_LIST + pickle.MARK
                                       + pickle.EMPTY_DICT * (MiB - 16) + pickle.APPENDS + pickle.STOP)
    monkeypatch.setenv(MAX_INDEX_ENV, "1")
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as e:
            read_checkpoint(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert "\n" not in message and str(folder) in message and MAX_INDEX_ENV in message, message
    assert "objects" in message, message
    assert peak < 16 * MiB, f"peak {peak / MiB:.0f} MiB"


def test_an_index_whose_keys_all_hash_alike_is_refused_at_once(sharded, tmp_path):
    """Python hashes an int to itself modulo 2**61 - 1: a dict of 40,000 int keys, all multiples of it (a 0.5 MB
    index), makes each key collide with every one before it, and pickle took 10 s to build it (quadratic: 200,000
    keys, 2.6 MB, take minutes) before the index was refused as no DCP index. An index's keys are names and records,
    whose hashes a file cannot choose: refused before any is added."""
    import time

    from models.checkpoints import read_checkpoint
    from models.errors import CheckpointError

    folder, every = copy_of(sharded, tmp_path), (1 << 61) - 1
    keys = b"".join(pickle.LONG1 + b"\x0a" + (k * every).to_bytes(10, "little", signed=True) + pickle.NONE
                    for k in range(1, 40_001))
    (folder / ".metadata").write_bytes(pickle.PROTO + b"\x04" + pickle.EMPTY_DICT + pickle.MARK + keys
                                       + pickle.SETITEMS + pickle.STOP)
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(folder)
    assert time.perf_counter() - start < 2.0
    message = str(e.value)
    assert "\n" not in message and str(folder) in message, message
    assert "dict keys other than names and records" in message, message


def _dcp_save(folder: Path, algorithms) -> Path:
    """A sharded checkpoint written by DCP itself, shaped as Composer's: the model's weights (24 MiB) under
    ``state.model``, and ``algorithms`` as the one non-tensor value Composer saves its EMA in."""
    import torch.distributed.checkpoint as dcp

    weights = {"unet.weight": torch.randn(6 << 20, generator=torch.Generator().manual_seed(0))}
    dcp.save({"state": {"model": weights, "algorithms": algorithms, "run_name": "run"}},
             checkpoint_id=str(folder), no_dist=True)
    return folder


def test_a_runs_ema_larger_than_any_plain_value_reads_back_whole(tmp_path):
    """Composer keeps the EMA in one non-tensor value (``state.algorithms``): the denoiser's weights whole. Held to
    the 16 MiB of a plain value, every sharded checkpoint of a model past 4M weights with EMA was refused, and
    autoresume set each one aside. It may hold tensors up to the model's bytes, and reads back equal."""
    from models.readers import load_sharded_state, sharded_problem

    ema = {"ema_model": {"unet.weight": torch.randn(6 << 20, generator=torch.Generator().manual_seed(1))}}
    folder = _dcp_save(tmp_path / "ep0-ba2", [("EMA", ema)])
    assert sharded_problem(folder) is None
    state = load_sharded_state(folder, skip=())
    assert torch.equal(state["algorithms"][0][1]["ema_model"]["unet.weight"], ema["ema_model"]["unet.weight"])


def test_a_value_whose_pickle_is_past_plain_datas_bound_is_refused_in_one_line(tmp_path):
    """Tensors may be as large as the model's; a value's pickle, which builds an object per few bytes, may not pass
    16 MiB, whatever the model's size."""
    from models.readers import sharded_problem

    folder = _dcp_save(tmp_path / "ep0-ba2", [("EMA", {"names": [f"layer {i:08d}" for i in range(1_500_000)]})])
    problem = sharded_problem(folder)
    assert problem is not None and "\n" not in problem and "state.algorithms" in problem, problem
    assert "pickle" in problem and "more than plain data may take" in problem, problem
