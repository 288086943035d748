"""Sharded checkpoints (``fsdp_state_dict_type: sharded``) read as plain data by every reader.

The folder here is batch 6 of a real 2-rank FSDP run (SHARD_GRAD_OP; each rank wrote its part, rank 0 the index):
the session's run that ``test_scale.py`` kills and resumes (``conftest.killed_and_resumed``), compared with the
same folder as one file by PyTorch's own reader. The hostile ones are that folder with one thing changed, as an
attacker who hands over a "checkpoint folder" would change it; one with a value that runs code is written by
``dcp.save`` in one process (``write_sharded``), as such an attacker would write it.
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
def sharded(killed_and_resumed) -> Path:
    """Batch 6 of the session's 2-rank FSDP run, as its ranks wrote it (read only: tests change copies)."""
    return Path(killed_and_resumed["resumed"]["folder"]) / "ep0-ba6"


@pytest.fixture(scope="module")
def consolidated(sharded, tmp_path_factory) -> Path:
    """The sharded folder as one file, by PyTorch's own reader (``dcp_to_torch_save``): the ``state`` tree and its
    RNG, Composer's layout of a full checkpoint."""
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path_factory.mktemp("consolidated") / "ep0-ba6-rank0.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process without a process group: DCP says it loads alone
        dcp_to_torch_save(str(sharded), str(out))
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def rewrite_index(folder: Path, change) -> None:
    """Change the folder's DCP index as plain Python objects and write it back."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(folder)).read_metadata()  # our own folder: its index is trusted here
    change(meta)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


class _Touch:
    """Unpickled, it creates the file it names: what a folder crafted to run code would do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


@pytest.mark.slow
def test_a_sharded_folder_reads_as_its_full_checkpoint(sharded, consolidated):
    """Found, listed, read and weighed as the full file PyTorch consolidates it into: raw and EMA weights, spec,
    step; the run's other checkpoints beside it (batch 2 of 4 ranks, batch 4 saved again over the kill's torn
    folder) are listed with it."""
    from models.checkpoints import discover, find_checkpoint, list_checkpoints, model_weights, read_checkpoint

    full, folder = read_checkpoint(consolidated), read_checkpoint(sharded)
    assert folder["spec"] == full["spec"] and folder["kind"] == full["kind"] == "composer"
    for ema in (False, True):
        a, b = model_weights(full, ema=ema), model_weights(folder, ema=ema)
        assert a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    found = find_checkpoint(sharded)
    assert (found.kind, found.step) == ("composer", 6) == (find_checkpoint(consolidated).kind, 6)
    run = sharded.parent
    assert [(c.path, c.step) for c in list_checkpoints(run)] == [(run / f"ep0-ba{n}", n) for n in (2, 4, 6)]
    assert [c.path for c in discover([run])] == [run / f"ep0-ba{n}" for n in (2, 4, 6)]


@pytest.mark.slow
def test_dwb_export_consolidates_a_sharded_folder(sharded, consolidated, tmp_path):
    """The answer for every tool that wants one file: `dwb export` writes the sharded folder's weights whole, as it
    writes those of the file PyTorch consolidates the folder into."""
    from safetensors.torch import load_file

    from models.export import export_checkpoint

    out, fmt = export_checkpoint(sharded, tmp_path / "one.safetensors", ema=True)
    ref, _ = export_checkpoint(consolidated, tmp_path / "ref.safetensors", ema=True)
    a, b = load_file(out), load_file(ref)
    assert fmt == "single-file" and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_part_cut_short_is_set_aside_by_autoresume(sharded, tmp_path):
    """A save cut short after its index was written (a part truncated, as a disk that lost its last writes leaves
    it; a kill leaves no index, ``test_scale.py``): autoresume sets it aside, never deletes it, and resumes from the
    checkpoint before."""
    from models.checkpoints import select_resume_checkpoint

    run = tmp_path / "checkpoints"
    older = Path(shutil.copytree(sharded, run / "ep0-ba2"))
    newer = Path(shutil.copytree(sharded, run / "ep0-ba8"))
    part = newer / "__1_0.distcp"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    assert select_resume_checkpoint(run) == older  # both hold batch 6; the torn one is named ba8
    assert (run / "ep0-ba8.corrupt").is_dir() and (run / "latest-rank0.pt").resolve() == older.resolve()


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


@pytest.mark.slow
def test_a_run_refuses_a_checkpoint_of_the_other_layout(sharded, tiny_run, tmp_path):
    """Composer's sharded loader fails deep inside on a file, and its full loader on a folder: one line first."""
    from train.config import load_config
    from models.errors import WorkbenchError
    from train.trainer import check_checkpoint_layout

    base = tiny_overrides(tmp_path, tmp_path, tmp_path / "c")
    full_run = load_config(CONFIG, [*base, "fsdp=true"])
    sharded_run = load_config(CONFIG, [*base, "fsdp=true", "fsdp_state_dict_type=sharded"])
    with pytest.raises(WorkbenchError, match=r"ep0-ba6 is a sharded checkpoint folder, which only a run with "
                                             r"fsdp=true fsdp_state_dict_type=sharded loads"):
        check_checkpoint_layout(full_run, sharded, "config key 'load_path'")
    with pytest.raises(WorkbenchError, match=r"ep0-ba4-rank0.pt is a full checkpoint file"):
        check_checkpoint_layout(sharded_run, tiny_run / "ep0-ba4-rank0.pt", "autoresume")
    check_checkpoint_layout(sharded_run, sharded, "autoresume")
