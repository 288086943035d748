"""`dwb evaluate watch RUN`: score each new checkpoint of a training run once, as it appears.

RUN is a local folder or an ``s3://`` prefix where training saves (``RUN`` or ``RUN/checkpoints``); every
checkpoint file counts, whatever its name (``models.checkpoints.list_checkpoints``).

A local checkpoint is scored only when it is finished: its size and mtime have not changed for ``settle``
seconds (an object in S3 appears whole, under its own ETag, and is fetched once). A local RUN that does not
exist yet is waited for, as when the watcher starts beside a training that has not created it. Which checkpoints are done is read from the results store, so a restarted watcher picks up
where the last one stopped. A settled file that is torn or
cannot be opened (a ``CheckpointError``) is recorded as ``unreadable`` and not tried again until the
file changes or the watcher starts with ``retry_unreadable``; so is a local checkpoint that would read anything
outside the run's folder (a single file's ``NAME.config/`` that is or holds a link out of it), before it is read.
Any other error is a problem of the setup (reference set, weights, output folder, device), not of that
checkpoint: it stops the watcher, and nothing is recorded against the checkpoint.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from models.checkpoints import Checkpoint, check_reads_inside, list_checkpoints, raise_reason
from models.errors import CheckpointError, WorkbenchError

from .store import ResultsStore, checkpoint_identity

log = logging.getLogger("evaluate.watch")


class Watcher:
    """Polls a run (a local folder or an ``s3://`` prefix); ``poll_once()`` scores every finished, unscored
    checkpoint and returns them. ``score`` and ``record_unreadable`` take a ``models.checkpoints.Checkpoint``."""

    def __init__(self, run: str | Path, store: ResultsStore, score: Callable[[Checkpoint], object],
                 record_unreadable: Callable[[Checkpoint, Exception], None], settle: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, retry_unreadable: bool = False):
        self.run = str(run)
        self.remote = self.run.startswith("s3://")
        self.store, self.score, self.record_unreadable = store, score, record_unreadable
        self.settle, self.clock, self.retry_unreadable = settle, clock, retry_unreadable
        self._seen: dict[Path, tuple[int, int, float]] = {}  # path -> (size, mtime_ns, first time seen so)

    def _stable(self, ckpt: Checkpoint) -> bool:
        if self.remote:
            return True  # an object appears whole, under an ETag of its own
        try:
            st = ckpt.path.stat()
        except FileNotFoundError:
            return False
        ident, now = (st.st_size, st.st_mtime_ns), self.clock()
        prev = self._seen.get(ckpt.path)
        if prev is None or prev[:2] != ident:
            self._seen[ckpt.path] = (*ident, now)
            return self.settle <= 0
        return now - prev[2] >= self.settle

    def _done(self, ckpt: Checkpoint, done: set) -> bool:
        ident = checkpoint_identity(ckpt)
        return (ckpt.ref, ident["file_size"], ident["file_mtime_ns"]) in done

    def poll_once(self) -> list[Checkpoint]:
        done = self.store.done(retry_unreadable=self.retry_unreadable)
        self.retry_unreadable = False  # once, at start: a retried file that fails again is recorded again
        scored = []
        for ckpt in list_checkpoints(self.run):
            if self._done(ckpt, done) or not self._stable(ckpt):
                continue
            try:
                if not self.remote:  # what it reads lies in the run's folder: RUN, or RUN/checkpoints it is listed in
                    check_reads_inside(ckpt.path, [Path(self.run).resolve(), ckpt.path.parent.resolve()], ckpt.label,
                                       "the run's folder")
                if ckpt.kind == "unreadable":  # settled yet not a checkpoint: torn by a killed run, or damaged
                    raise_reason(ckpt.path)
                self.score(ckpt)
            except CheckpointError as e:  # that checkpoint only: record it and go on with the others
                self.record_unreadable(ckpt, e)
                continue
            scored.append(ckpt)
        return scored

    def wait_for_run(self, interval: float = 30.0, max_wait: float | None = None) -> None:
        """Returns once the run's folder exists (at once for an ``s3://`` prefix, whose objects appear with the
        first checkpoint), saying once that it waits: a watcher may start beside a training that has not
        created its folder yet. After ``max_wait`` seconds (None: no limit) it stops with one line."""
        if self.remote or Path(self.run).is_dir():
            return
        print(f"waiting for the run folder {self.run} to appear (checked every {interval:g} s"
              + (f", for at most {max_wait:g} s)" if max_wait is not None else ")"), flush=True)
        start = self.clock()
        while not Path(self.run).is_dir():
            left = None if max_wait is None else max_wait - (self.clock() - start)
            if left is not None and left <= 0:
                raise WorkbenchError(f"run folder {self.run} did not appear within {max_wait:g} s (--max-wait)")
            time.sleep(interval if left is None else min(interval, left))

    def run_forever(self, interval: float = 30.0, max_polls: int | None = None, max_wait: float | None = None) -> None:
        self.wait_for_run(interval, max_wait)
        polls = 0
        while max_polls is None or polls < max_polls:
            for ckpt in self.poll_once():
                print(f"scored {ckpt.label} ({ckpt.ref})", flush=True)
            polls += 1
            if max_polls is None or polls < max_polls:
                time.sleep(interval)
