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

What each checkpoint is scored as (``WatchedEntries``, entries of ``models.checkpoints``, named and hashed as
AUTOMATIC1111 names a LoRA):

- a checkpoint of the whole model: itself, or with adapter files applied when RUN is given as an entry,
  ``RUN + FILE@S`` (each checkpoint then scored as ``CHECKPOINT + FILE@S``);
- an adapter checkpoint (a run with an ``adapter:`` section holds the adapter alone): its adapter written as a file,
  ``OUT/adapters/<checkpoint>.safetensors`` (``models.export.write_adapter_file``, the app's rule too: in its
  family's ``lora_layout``: kohya's, which AUTOMATIC1111 reads, for a
  LoRA of SD 1/2 or SDXL; the peft layout, which holds every kind and family, otherwise), applied to the base its spec names
  (``model.init_from``, or ``--base`` where that path does not lead to it from here; checked by content hash) at each
  strength given (``--strengths``, default 1). The row's step, cost and file identity are the adapter checkpoint's.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from models.checkpoints import (Checkpoint, Entry, EntryAdapter, check_reads_inside, content_hash, entry_adapter,
                                entry_ref, find_checkpoint, list_checkpoints, raise_reason, weights_of)
from models.errors import CheckpointError, WorkbenchError

from .layout import safe_path_part
from .store import ResultsStore, checkpoint_identity

log = logging.getLogger("evaluate.watch")


class WatchedEntries:
    """What each checkpoint of a watched run is scored as (the module's note): ``adapters`` applied to every
    checkpoint (stacked after an adapter checkpoint's own); an adapter checkpoint's adapter, written under
    ``out``/adapters, on its base at each of ``strengths``, in the weights ``weights`` chooses (auto, ema, raw:
    ``models.checkpoints.weights_of``)."""

    def __init__(self, out: str | Path, adapters: tuple[EntryAdapter, ...] = (), strengths: tuple[float, ...] = (1.0,),
                 base: str | None = None, weights: str = "auto"):
        self.folder, self.adapters, self.strengths, self.base, self.weights = Path(out) / "adapters", adapters, \
            strengths, base, weights
        self._bases: dict[tuple[str, str], Checkpoint] = {}

    @staticmethod
    def adapter_checkpoint(ckpt: Checkpoint) -> tuple[dict, Checkpoint] | None:
        """(the adapter section of an adapter checkpoint's spec, the checkpoint's local copy: an ``s3://`` one
        fetched once per ETag); None for every other checkpoint (and for one that does not read: scoring it says
        why)."""
        from models.export import adapter_of

        if ckpt.kind != "composer":
            return None
        try:
            local = ckpt if ckpt.path is not None else find_checkpoint(ckpt.ref)
            adapter = adapter_of(local)
        except CheckpointError:
            return None
        return None if adapter is None else (adapter, local)

    def base_of(self, ckpt: Checkpoint, adapter: dict) -> Checkpoint:
        """The base an adapter checkpoint was trained on: ``--base``, else its spec's ``model.init_from``, whose
        content hash must be the one the spec names; a one-line WorkbenchError (the setup's) otherwise."""
        named = adapter.get("base") or {}
        ref, wanted = self.base or str(named.get("init_from")), str(named.get("content_hash"))
        if (ref, wanted) not in self._bases:
            try:
                found = find_checkpoint(ref)
            except WorkbenchError as e:
                raise WorkbenchError(f"{ckpt.label} is an adapter of {ref}, which is not found from here ({e}): give "
                                     f"--base, the checkpoint the run trained on") from None
            if content_hash(found) != wanted:
                raise WorkbenchError(f"{ckpt.label} is an adapter of the base with content hash {wanted}, and {ref} "
                                     f"has {content_hash(found)}: give --base, the checkpoint the run trained on")
            self._bases[(ref, wanted)] = found
        return self._bases[(ref, wanted)]

    def file_of(self, ckpt: Checkpoint, local: Checkpoint) -> Path:
        """Where an adapter checkpoint's adapter is written (its weights in the name: raw or EMA)."""
        return self.folder / f"{safe_path_part(ckpt.label)}-{weights_of(local, self.weights)}.safetensors"

    def refs(self, ckpt: Checkpoint) -> list[str]:
        """The references the rows of ``ckpt``'s entries carry (``Entry.ref``), known without writing a file."""
        found = self.adapter_checkpoint(ckpt)
        if found is not None:
            base = self.base_of(ckpt, found[0]).ref
            given = [(a.path, a.strength) for a in self.adapters]
            return [entry_ref(base, [(self.file_of(ckpt, found[1]), s), *given]) for s in self.strengths]
        return [entry_ref(ckpt.ref, [(a.path, a.strength) for a in self.adapters])]

    def entries(self, ckpt: Checkpoint) -> list[Entry]:
        """``ckpt``'s entries; an adapter checkpoint's adapter written as a file first (whole, or not at all)."""
        found = self.adapter_checkpoint(ckpt)
        if found is None:
            return [Entry(ckpt, self.adapters)]
        from models.export import write_adapter_file

        adapter, local = found
        written = entry_adapter(write_adapter_file(local, self.file_of(ckpt, local), self.weights), 1.0)
        base = self.base_of(ckpt, adapter)
        return [Entry(base, (EntryAdapter(written.path, float(s), written.name, written.hash), *self.adapters))
                for s in self.strengths]


class Watcher:
    """Polls a run (a local folder or an ``s3://`` prefix); ``poll_once()`` scores every finished, unscored
    checkpoint and returns them. ``score`` and ``record_unreadable`` take a ``models.checkpoints.Checkpoint``;
    ``recorded_as`` gives the references its rows carry (``WatchedEntries.refs``; default: its own)."""

    def __init__(self, run: str | Path, store: ResultsStore, score: Callable[[Checkpoint], object],
                 record_unreadable: Callable[[Checkpoint, Exception], None], settle: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, retry_unreadable: bool = False,
                 recorded_as: Callable[[Checkpoint], list[str]] | None = None):
        self.run = str(run)
        self.remote = self.run.startswith("s3://")
        self.store, self.score, self.record_unreadable = store, score, record_unreadable
        self.recorded_as = recorded_as or (lambda ckpt: [ckpt.ref])
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
        return all((ref, ident["file_size"], ident["file_mtime_ns"]) in done for ref in self.recorded_as(ckpt))

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
