"""Sharded checkpoints (``fsdp_state_dict_type: sharded``) read as plain data by every reader.

The folders here are written by torch.distributed.checkpoint itself (``dcp.save`` in one process) from the suite's
tiny run's full checkpoint, so they hold what Composer's sharded save holds: the ``state`` tree and its RNG,
flattened into DCP's index and parts. The hostile ones are those folders with one thing changed, as an attacker
who hands over a "checkpoint folder" would change it. The multi-rank runs that write and resume them are in
``test_scale.py``.
"""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from ..conftest import REPO, tiny_overrides

CONFIG = REPO / "configs" / "tiny-phase1.yaml"


def write_sharded(full: Path, out: Path, extra: dict | None = None) -> Path:
    """``full``'s Composer state saved by DCP into the folder ``out`` (as a sharded save lays it out)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from models.checkpoints.composer import SAFE_TYPES

    with torch.serialization.safe_globals(SAFE_TYPES):
        ckpt = torch.load(full, map_location="cpu", weights_only=True)
    state = {"state": {**ckpt["state"], **(extra or {})}, "rng": ckpt["rng"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process without a process group: DCP says it saves alone
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(out)))
    return out


@pytest.fixture(scope="module")
def sharded(tiny_run, tmp_path_factory) -> Path:
    return write_sharded(tiny_run / "ep0-ba4-rank0.pt", tmp_path_factory.mktemp("sharded") / "ep0-ba4")


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def rewrite_index(folder: Path, change) -> None:
    """Change the folder's DCP index as plain Python objects and write it back."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(folder)).read_metadata()  # our own folder: its index is trusted here
    change(meta)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


def without_empty(tree):
    """DCP stores leaves only: an empty dict (a text encoder config's ``pruned_heads``) is not kept."""
    if not isinstance(tree, dict):
        return tree
    return {k: without_empty(v) for k, v in tree.items() if not (isinstance(v, dict) and not v)}


class _Touch:
    """Unpickled, it creates the file it names: what a folder crafted to run code would do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_a_sharded_folder_reads_as_its_full_checkpoint(tiny_run, sharded):
    """Found, listed, read and weighed as the full file it was made from: raw and EMA weights, spec, step."""
    from models.checkpoints import discover, find_checkpoint, list_checkpoints, model_weights, read_checkpoint

    full, folder = read_checkpoint(tiny_run / "ep0-ba4-rank0.pt"), read_checkpoint(sharded)
    assert folder["spec"] == without_empty(full["spec"]) and folder["kind"] == "composer"
    for ema in (False, True):
        a, b = model_weights(full, ema=ema), model_weights(folder, ema=ema)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    found = find_checkpoint(sharded)
    assert (found.kind, found.step) == ("composer", 4)
    assert [c.path for c in list_checkpoints(sharded.parent)] == [sharded]
    assert [c.path for c in discover([sharded.parent])] == [sharded]


def test_dwb_export_consolidates_a_sharded_folder(tiny_run, sharded, tmp_path):
    """The answer for every tool that wants one file: `dwb export` writes the sharded folder's weights whole."""
    from safetensors.torch import load_file

    from models.export import export_checkpoint

    out, fmt = export_checkpoint(sharded, tmp_path / "one.safetensors", ema=True)
    ref, _ = export_checkpoint(tiny_run / "ep0-ba4-rank0.pt", tmp_path / "ref.safetensors", ema=True)
    a, b = load_file(out), load_file(ref)
    assert fmt == "single-file" and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_index_that_runs_code_when_unpickled_is_refused_without_running_it(sharded, tmp_path):
    """PyTorch reads a sharded checkpoint's index with a bare pickle.load: a folder whose ``.metadata`` creates a
    file when unpickled would create it in every reader (the app lists what is under its roots). Refused in one
    line; nothing is created."""
    from models.checkpoints import find_checkpoint
    from models.errors import CheckpointError

    folder, marker = copy_of(sharded, tmp_path), tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps({"index": _Touch(marker)}))
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(folder)
    assert not marker.exists()
    assert "the index names pathlib" in str(e.value) and "\n" not in str(e.value)


def test_a_value_that_runs_code_is_refused_by_readers_and_autoresume(tiny_run, tmp_path):
    """DCP stores each non-tensor value with torch.save and reads it back with ``weights_only=False``: a value
    that creates a file when loaded is refused by the readers and by autoresume, which sets the folder aside
    before Composer would load it; nothing is created."""
    from models.checkpoints import find_checkpoint, read_checkpoint, select_resume_checkpoint
    from models.errors import CheckpointError

    marker = tmp_path / "ran"
    run = tmp_path / "run" / "checkpoints"
    folder = write_sharded(tiny_run / "ep0-ba4-rank0.pt", run / "ep0-ba4", extra={"note": _Touch(marker)})
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(folder)
    assert "state.note" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CheckpointError):
        find_checkpoint(folder)
    assert select_resume_checkpoint(run) is None
    assert (run / "ep0-ba4.corrupt").is_dir() and not folder.exists()
    assert not marker.exists()


def test_an_index_naming_a_file_outside_its_folder_is_refused(sharded, tmp_path):
    """A part named ``../secret.distcp`` (or an absolute path) would be read from wherever it points."""
    from models.checkpoints import read_checkpoint
    from models.errors import CheckpointError

    folder = copy_of(sharded, tmp_path)
    (tmp_path / "secret.distcp").write_bytes((folder / "__0_0.distcp").read_bytes())

    def outside(meta):
        for info in meta.storage_data.values():
            info.relative_path = "../secret.distcp"

    rewrite_index(folder, outside)
    with pytest.raises(CheckpointError, match=r"names a part '\.\./secret\.distcp' that is not a file of the folder"):
        read_checkpoint(folder)


def test_a_declared_size_beyond_the_parts_is_refused_before_anything_is_allocated(sharded, tmp_path):
    """A weight declared as 2**40 floats (4 TiB) would be allocated whole before its chunks are copied in: the
    index's sizes are held to the bytes the parts hold first. Run under a 4 GiB address-space limit."""
    import subprocess
    import sys

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = copy_of(sharded, tmp_path)

    def huge(meta):
        name = next(k for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
                    and k.startswith("state.model.unet"))
        meta.state_dict_metadata[name].size = torch.Size([2**40])

    rewrite_index(folder, huge)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "from models.checkpoints import read_checkpoint\n"
            "from models.errors import CheckpointError\n"
            "try:\n    read_checkpoint(sys.argv[1])\nexcept CheckpointError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert "declares" in done.stdout and "more than its parts hold" in done.stdout, done.stderr[-2000:]


def test_a_negative_size_cannot_hide_a_huge_one_in_the_sum(sharded, tmp_path):
    """Two weights declared as 2**40 + a real size and -2**40 sum to what the parts hold: refused by the sign
    before the first is allocated."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from models.checkpoints import read_checkpoint
    from models.errors import CheckpointError

    folder = copy_of(sharded, tmp_path)

    def hiding(meta):
        a, b = [v for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
                and k.startswith("state.model.unet") and len(v.size) == 1][:2]
        a.size, b.size = torch.Size([2**40 + b.size.numel()]), torch.Size([-(2**40)])  # the huge one read first

    rewrite_index(folder, hiding)
    with pytest.raises(CheckpointError, match="declares a tensor of negative size"):
        read_checkpoint(folder)


def test_a_part_cut_short_is_set_aside_by_autoresume(sharded, tmp_path):
    """A save cut short after its index was written (a part truncated): autoresume sets it aside, never deletes
    it, and resumes from the checkpoint before."""
    from models.checkpoints import select_resume_checkpoint

    run = tmp_path / "checkpoints"
    older = Path(shutil.copytree(sharded, run / "ep0-ba2"))
    newer = Path(shutil.copytree(sharded, run / "ep0-ba6"))
    part = newer / "__0_0.distcp"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    assert select_resume_checkpoint(run) == older  # both hold batch 4; the torn one is named ba6
    assert (run / "ep0-ba6.corrupt").is_dir() and (run / "latest-rank0.pt").resolve() == older.resolve()


def test_sharded_needs_fsdp_and_a_local_save_folder(tmp_path):
    from train.config import load_config
    from models.errors import WorkbenchError

    base = tiny_overrides(tmp_path, tmp_path, tmp_path / "c")
    with pytest.raises(WorkbenchError, match=r"^config key 'fsdp_state_dict_type' is sharded, which needs "
                                             r"fsdp=true"):
        load_config(CONFIG, [*base, "fsdp_state_dict_type=sharded"])
    with pytest.raises(WorkbenchError, match=r"give a local save_folder, not s3://bucket/run"):
        load_config(CONFIG, [*base, "fsdp=true", "fsdp_state_dict_type=sharded", "save_folder=s3://bucket/run"])
    assert load_config(CONFIG, [*base, "fsdp=true", "fsdp_state_dict_type=sharded"]).fsdp_state_dict_type == "sharded"


def test_a_run_refuses_a_checkpoint_of_the_other_layout(sharded, tiny_run, tmp_path):
    """Composer's sharded loader fails deep inside on a file, and its full loader on a folder: one line first."""
    from train.config import load_config
    from models.errors import WorkbenchError
    from train.trainer import check_checkpoint_layout

    base = tiny_overrides(tmp_path, tmp_path, tmp_path / "c")
    full_run = load_config(CONFIG, [*base, "fsdp=true"])
    sharded_run = load_config(CONFIG, [*base, "fsdp=true", "fsdp_state_dict_type=sharded"])
    with pytest.raises(WorkbenchError, match=r"ep0-ba4 is a sharded checkpoint folder, which only a run with "
                                             r"fsdp=true fsdp_state_dict_type=sharded loads"):
        check_checkpoint_layout(full_run, sharded, "config key 'load_path'")
    with pytest.raises(WorkbenchError, match=r"ep0-ba4-rank0.pt is a full checkpoint file"):
        check_checkpoint_layout(sharded_run, tiny_run / "ep0-ba4-rank0.pt", "autoresume")
    check_checkpoint_layout(sharded_run, sharded, "autoresume")
