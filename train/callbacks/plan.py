"""`dwb plan`: measured throughput -> what a schedule takes, as the seed's Table 1 (GPUs, images/s, days,
GPU-hours, cost), each row marked measured or extrapolated.

Extrapolation starts from the measured row nearest in GPU count and keeps ``scaling_efficiency`` of the
linear speed-up per doubling of GPUs (a stated input, printed with the table): images/s at N GPUs =
images/s at n x (N / n) x efficiency ** log2(N / n).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from models.errors import WorkbenchError


@dataclass
class Row:
    gpus: int
    images_per_sec: float
    measured: bool
    samples: int
    usd_per_gpu_hour: float | None

    @property
    def days(self) -> float:
        return self.samples / self.images_per_sec / 86400

    @property
    def gpu_hours(self) -> float:
        return self.samples / self.images_per_sec / 3600 * self.gpus

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.gpu_hours * self.usd_per_gpu_hour


def extrapolated(measured: dict[int, float], gpus: int, efficiency: float) -> float:
    n = min(measured, key=lambda m: (abs(math.log2(gpus / m)), -m))
    ratio = gpus / n
    return measured[n] * ratio * efficiency ** math.log2(ratio)


def plan_rows(measured: dict[int, float], samples: int, gpus: list[int], efficiency: float,
              usd_per_gpu_hour: float | None) -> list[Row]:
    if not measured:
        raise WorkbenchError("dwb plan needs at least one measured throughput (--measured GPUS:IMAGES_PER_SEC or --run)")
    counts = sorted(set(gpus) | set(measured))
    return [Row(n, measured[n] if n in measured else extrapolated(measured, n, efficiency), n in measured, samples,
                usd_per_gpu_hour) for n in counts]


def schedule_samples(configs: list) -> int:
    """Samples of a schedule: each phase's ``max_duration`` in batches x its global batch (or in samples)."""
    total = 0
    for cfg in configs:
        value, unit = _duration(cfg.max_duration)
        if unit == "ba":
            total += value * cfg.global_train_batch_size
        elif unit == "sp":
            total += value
        else:
            raise WorkbenchError(f"config {cfg.run_name}: max_duration {cfg.max_duration} is not in batches or samples; "
                                 f"give --samples")
    return total


def _duration(text: str) -> tuple[int, str]:
    import re

    m = re.fullmatch(r"(\d+)([a-z]+)", text.strip())
    return int(m.group(1)), m.group(2)


def measured_from_run(run_dir: str | Path) -> tuple[int, float]:
    """(GPUs, images/s) of a run's latest start: the median of SpeedMonitor's ``throughput/samples_per_sec``
    (logged from its 20th batch on), else samples over wall time, with the process count the cost callback logged."""
    from .curves import read_run

    seg = read_run(run_dir)[-1]
    gpus = [y for _, y in seg.series.get("cost/gpus", [])]
    rates = [y for _, y in seg.series.get("throughput/samples_per_sec", [])]
    samples = [y for _, y in seg.series.get("time/sample", [])]
    hours = [y for _, y in seg.series.get("cost/segment_wall_hours", [])]
    if not rates and len(samples) > 1 and hours and hours[-1] > 0:
        rates = [(samples[-1] - samples[0]) / (hours[-1] * 3600)]
    if not rates or not gpus:
        raise WorkbenchError(f"{run_dir}: its log has no throughput or process count to plan from")
    return int(gpus[-1]), statistics.median(rates)


def table(rows: list[Row], efficiency: float) -> str:
    lines = ["| GPUs | images/s | days | GPU-hours | cost | row |", "|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cost = f"${r.usd:,.0f}" if r.usd is not None else "-"
        lines.append(f"| {r.gpus} | {r.images_per_sec:,.1f} | {r.days:,.1f} | {r.gpu_hours:,.0f} | {cost} | "
                     f"{'measured' if r.measured else f'extrapolated ({efficiency:g} per doubling)'} |")
    return "\n".join(lines)
