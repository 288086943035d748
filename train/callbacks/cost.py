"""What a run costs: wall time and GPU-hours to reach each checkpoint, dollars at a given rate, an ETA.

Time counts while a process trains (from the fit's start to each batch's end, validation and previews
included); the gaps between a kill and the resume are not counted, and the work lost after the last
checkpoint is not in the later checkpoints (it did not lead to them). The totals ride in every checkpoint
(this callback's state), so a resume continues them, and a phase loaded with weights only starts from the
earlier phase's totals (``carried``). GPU-hours are wall hours x processes (one GPU each; CPU processes on
a CPU run).
"""
from __future__ import annotations

import time

from composer.core import Callback, Event, State
from composer.loggers import Logger


class RunCost(Callback):
    def __init__(self, usd_per_gpu_hour: float | None = None, carried: dict | None = None):
        self.usd_per_gpu_hour = usd_per_gpu_hour
        self.earlier_gpu_hours = float((carried or {}).get("gpu_hours_total", 0.0))
        self.wall_seconds = 0.0  # this phase, along the checkpoint's line of resumes
        self.gpu_seconds = 0.0
        self.segment_seconds = 0.0  # this process
        self.resumes = 0
        self._last: float | None = None
        self._segment_start_batch = 0

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        from composer.utils import dist

        if event == Event.FIT_START:
            self._last = time.monotonic()
            self._segment_start_batch = int(state.timestamp.batch)
            if self._segment_start_batch > 0:
                self.resumes += 1
            logger.log_metrics({"cost/gpus": dist.get_world_size(), "cost/resumed_at_batch": self._segment_start_batch})
        elif event == Event.BATCH_END and self._last is not None:
            now = time.monotonic()
            step = now - self._last
            self._last = now
            self.wall_seconds += step
            self.segment_seconds += step
            self.gpu_seconds += step * dist.get_world_size()
            logger.log_metrics(self.figures(state))

    def figures(self, state: State) -> dict[str, float]:
        out = {"cost/wall_hours": self.wall_seconds / 3600, "cost/gpu_hours": self.gpu_seconds / 3600,
               "cost/gpu_hours_total": self.earlier_gpu_hours + self.gpu_seconds / 3600,
               "cost/segment_wall_hours": self.segment_seconds / 3600}
        if self.usd_per_gpu_hour is not None:
            out["cost/usd"] = out["cost/gpu_hours"] * self.usd_per_gpu_hour
            out["cost/usd_total"] = out["cost/gpu_hours_total"] * self.usd_per_gpu_hour
        eta = eta_hours(state, self._segment_start_batch, self.segment_seconds)
        if eta is not None:
            out["time/eta_hours"] = eta
        return out

    def state_dict(self) -> dict:
        return {"wall_seconds": self.wall_seconds, "gpu_seconds": self.gpu_seconds, "resumes": self.resumes,
                "segment_seconds": self.segment_seconds,  # this process's share (a resume starts it again)
                "gpu_hours": self.gpu_seconds / 3600, "gpu_hours_total": self.earlier_gpu_hours + self.gpu_seconds / 3600,
                "earlier_gpu_hours": self.earlier_gpu_hours, "usd_per_gpu_hour": self.usd_per_gpu_hour}

    def load_state_dict(self, state: dict) -> None:
        self.wall_seconds = float(state.get("wall_seconds", 0.0))
        self.gpu_seconds = float(state.get("gpu_seconds", 0.0))
        self.resumes = int(state.get("resumes", 0))
        self.earlier_gpu_hours = float(state.get("earlier_gpu_hours", self.earlier_gpu_hours))


def eta_hours(state: State, start_batch: int, seconds: float) -> float | None:
    """Hours to ``max_duration`` (in batches) at this process's pace so far."""
    end, batch = state.max_duration, int(state.timestamp.batch)
    if end is None or end.unit.name != "BATCH" or batch <= start_batch:
        return None
    return (end.value - batch) * seconds / (batch - start_batch) / 3600
