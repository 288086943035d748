"""Autoresume: the newest usable checkpoint of a save folder, and why a file is not usable.

Autoresume resumes only from a file that reads whole (zip structure and every member's CRC) *and* loads
with ``weights_only=True``: Composer itself unpickles with ``weights_only=False``, so a file that needs more
than plain data to load is set aside (renamed, never deleted), never opened by it.
"""
from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path

from ..errors import CheckpointError, first_line
from .composer import load_state
from .find import list_checkpoints
from ..readers import check_inflation, is_sharded_folder, sharded_problem

log = logging.getLogger("train.checkpoint")


def checkpoint_problem(path: str | Path) -> str | None:
    """Why a checkpoint file cannot be resumed from (truncated, corrupt), or None when it reads whole.

    PyTorch checkpoints are zip archives: the central directory at the end catches truncation and
    each member's CRC-32 catches corrupted bytes, without unpickling anything. Members that would inflate past
    ``ziphead.max_inflated()`` are a problem before any of them is read.
    """
    try:
        check_inflation(path)
    except CheckpointError as e:
        return str(e)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"{type(e).__name__}: {first_line(e)}"
    return f"corrupt member {bad}" if bad else None


def resume_problem(path: str | Path) -> str | None:
    """Why Composer must not resume from this file (or sharded folder): torn, corrupt, or not loadable as plain
    data. Composer reads a sharded folder's index with ``pickle.load`` and its values with
    ``weights_only=False``, so each is read here first as plain data (``sharded.sharded_problem``)."""
    if is_sharded_folder(path):
        return sharded_problem(path)
    problem = checkpoint_problem(path)
    if problem is None:
        try:
            load_state(path)
        except CheckpointError as e:
            problem = str(e)
    return problem


def set_aside(path: Path, problem: str) -> Path:
    """Rename an unusable checkpoint (a file, or a sharded checkpoint's folder) to ``*.corrupt`` (never deleted)
    with a warning."""
    aside = path.with_name(path.name + ".corrupt")
    path.rename(aside)
    log.warning("warning: checkpoint %s is unreadable (%s); moved to %s and resuming from an earlier one",
                path, problem, aside.name)
    return aside


def select_resume_checkpoint(folder: str | Path, latest_name: str = "latest-rank0.pt") -> Path | None:
    """Point ``latest_name`` at the newest usable checkpoint in ``folder`` and return it.

    The newest is the one with the most batches (its timestamp, whatever its file name); unusable ones
    (a run killed while writing, a damaged disk, a file that would run code when unpickled) are set aside.
    A sharded checkpoint is its folder (``ep0-ba4/``), which ``latest_name`` then points at, as Composer's
    sharded loader expects; one whose index is missing (DCP writes it last) was never finished and is not listed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    latest = folder / latest_name
    for found in reversed(list_checkpoints(folder, kinds=("composer", "unreadable"))):
        ckpt = found.path
        problem = resume_problem(ckpt)
        if problem is None:
            if latest.is_symlink() or latest.exists():
                if latest.resolve() == ckpt.resolve():
                    return ckpt
                latest.unlink()
            os.symlink(ckpt.name, latest)
            return ckpt
        set_aside(ckpt, problem)
    if latest.is_symlink() and not latest.exists():
        latest.unlink()  # a link to a checkpoint that was moved aside
    return None
