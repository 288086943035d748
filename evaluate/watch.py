"""`dwb evaluate watch RUN_DIR`: score each new checkpoint of a training run once, as it appears.

A checkpoint is scored only when it is finished: its size and mtime have not changed for ``settle``
seconds. Which checkpoints are done is read from the results store, so a restarted watcher picks up
where the last one stopped. A settled file that is torn (``train.checkpoint.checkpoint_problem``) or
cannot be opened (a ``CheckpointError``) is recorded as ``unreadable`` and not tried again until the
file changes or the watcher starts with ``retry_unreadable``. Any other error is a problem of the setup
(reference set, weights, output folder, device), not of that checkpoint: it stops the watcher, and
nothing is recorded against the checkpoint.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from train.checkpoint import checkpoint_problem
from train.errors import CheckpointError, WorkbenchError

from .store import ResultsStore, file_identity

log = logging.getLogger("evaluate.watch")
PATTERN = "ep*-ba*-rank0.pt"


def checkpoint_folder(run_dir: str | Path) -> Path:
    """``RUN_DIR/checkpoints`` when it exists, else ``RUN_DIR`` itself."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise WorkbenchError(f"run folder not found: {run_dir}")
    return run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir


def _step(path: Path) -> int:
    m = re.search(r"ba(\d+)", path.name)
    return int(m.group(1)) if m else -1


class Watcher:
    """Polls a folder; ``poll_once()`` scores every finished, unscored checkpoint and returns them."""

    def __init__(self, run_dir: str | Path, store: ResultsStore, score: Callable[[Path], object],
                 record_unreadable: Callable[[Path, Exception], None], settle: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, retry_unreadable: bool = False):
        self.folder = checkpoint_folder(run_dir)
        self.store, self.score, self.record_unreadable = store, score, record_unreadable
        self.settle, self.clock, self.retry_unreadable = settle, clock, retry_unreadable
        self._seen: dict[Path, tuple[int, int, float]] = {}  # path -> (size, mtime_ns, first time seen so)

    def _stable(self, path: Path) -> bool:
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        ident, now = (st.st_size, st.st_mtime_ns), self.clock()
        prev = self._seen.get(path)
        if prev is None or prev[:2] != ident:
            self._seen[path] = (*ident, now)
            return self.settle <= 0
        return now - prev[2] >= self.settle

    def _done(self, path: Path, done: set) -> bool:
        ident = file_identity(path)
        return (str(path), ident["file_size"], ident["file_mtime_ns"]) in done

    def poll_once(self) -> list[Path]:
        done = self.store.done(retry_unreadable=self.retry_unreadable)
        self.retry_unreadable = False  # once, at start: a retried file that fails again is recorded again
        scored = []
        for path in sorted(self.folder.glob(PATTERN), key=_step):
            if self._done(path, done) or not self._stable(path):
                continue
            try:
                problem = checkpoint_problem(path)
                if problem is not None:  # settled yet torn: a run killed while writing it, or a damaged disk
                    raise CheckpointError(f"{path} is truncated or corrupt ({problem})")
                self.score(path)
            except CheckpointError as e:  # that checkpoint only: record it and go on with the others
                self.record_unreadable(path, e)
                continue
            scored.append(path)
        return scored

    def run(self, interval: float = 30.0, max_polls: int | None = None) -> None:
        polls = 0
        while max_polls is None or polls < max_polls:
            for path in self.poll_once():
                print(f"scored {path}", flush=True)
            polls += 1
            if max_polls is None or polls < max_polls:
                time.sleep(interval)
