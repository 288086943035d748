"""The app's job list: every generation request of this server, queued, running or finished, with its progress.

Queued requests are the events waiting in Gradio's queue (``app.gradio_patches.queue_waiting``); running and
finished ones are recorded here as the handlers run them (``JobBoard.running``), the last ``KEEP`` finished kept.

What a viewer sees, as the app may be open to a network: every request's number, kind, state, progress (its place
in the queue, the step or cell it is at, or how it ended and in how long) and image size and count, so a user can
tell how busy the server is and where their own request stands; the prompt and the checkpoint's label only of the
viewer's own requests (their browser session, or API client). Another client's prompt, checkpoint and address are
never shown, nor is any server path (the handlers record checkpoints by their labels under the folders, and
nothing else of a request is shown).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from dataclasses import dataclass, field

from models.generation import Stopped

KEEP = 20  # finished requests listed after the queued and running ones
PROMPT_CHARS = 80  # of the viewer's own prompts
CHECKPOINT_CHARS = 200  # of the viewer's own checkpoints' names
COLUMNS = ("#", "request", "state", "progress", "size", "prompt", "checkpoint")
KINDS = {"generate": "Generate", "compare": "Compare", "xyz_plot": "X/Y/Z plot"}  # handler -> what the list says
OTHERS = "(another client's)"


def size_of(width, height, count=None) -> str:
    """``"WxH x N"`` of what a request asked for, where each is a whole number of at most 6 digits; "?" otherwise
    (what a client sent is shown to every client here, before the request's own checks have run)."""
    values = (width, height) if count is None else (width, height, count)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v == int(v) and 0 < v < 10**6
               for v in values):
        return "?"
    return f"{int(width)}x{int(height)}" + ("" if count is None else f" x {int(count)}")


@dataclass
class Job:
    number: int
    kind: str
    session: str
    prompt: str
    checkpoint: str  # its label under the folders (a comparison's: the labels joined)
    size: str  # "WxH x N"
    state: str = "running"  # then "done", "stopped" or "failed"
    done: int = 0
    total: int = 0
    unit: str = "step"
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    def progress(self) -> str:
        if self.state == "running":
            return f"{self.unit} {self.done} of {self.total}" if self.total else "starting"
        return f"in {self.seconds:.1f} s"


class JobBoard:
    """Running and finished requests, by number; thread-safe (handlers run on Gradio's worker threads)."""

    def __init__(self, keep: int = KEEP):
        self._jobs: list[Job] = []
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self.keep = keep

    @contextlib.contextmanager
    def running(self, kind: str, session: str, prompt, checkpoint, size: str, unit: str = "step"):
        """A request recorded as running while the context lasts, then done, stopped (the Stop button's
        ``models.generation.Stopped``) or failed; yields the job, whose ``done`` and ``total`` are its progress."""
        with self._lock:
            job = Job(next(self._numbers), kind, session, str(prompt or "")[:PROMPT_CHARS],
                      str(checkpoint or "")[:CHECKPOINT_CHARS], size, unit=unit)
            self._jobs.append(job)
        try:
            yield job
            job.state = "done"
        except BaseException as e:
            job.state = "stopped" if isinstance(e, Stopped) else "failed"
            raise
        finally:
            job.seconds = time.monotonic() - job.started
            with self._lock:
                finished = [j for j in self._jobs if j.state != "running"]
                for old in finished[:max(0, len(finished) - self.keep)]:
                    self._jobs.remove(old)

    @staticmethod
    def stepping(job: Job, hook=None):
        """A step hook ``(done, total)`` that records the job's progress, then calls ``hook``."""
        def step(done: int, total: int, *rest) -> None:
            job.done, job.total = int(done), int(total)
            if hook is not None:
                hook(done, total, *rest)

        return step

    def rows(self, viewer: str, waiting: list[tuple[str, str, str, str, str]]) -> list[list]:
        """The list ``viewer`` (a session) sees: ``waiting`` requests first, as (session, kind, prompt, checkpoint,
        size) in queue order, then the running ones, then the finished, newest first (see the module's note)."""
        def shown(session: str, prompt: str, checkpoint: str) -> list[str]:
            return [prompt[:PROMPT_CHARS], checkpoint[:CHECKPOINT_CHARS]] if session and session == viewer \
                else [OTHERS, ""]

        rows = [["", kind, "queued", f"{k} ahead" if k else "next", size, *shown(session, str(prompt), str(ckpt))]
                for k, (session, kind, prompt, ckpt, size) in enumerate(waiting)]
        with self._lock:
            jobs = list(self._jobs)
        live = [j for j in jobs if j.state == "running"]
        ended = [j for j in reversed(jobs) if j.state != "running"]
        rows += [[str(j.number), j.kind, j.state, j.progress(), j.size, *shown(j.session, j.prompt, j.checkpoint)]
                 for j in live + ended]
        return rows
