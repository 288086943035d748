"""A run's curves from Composer's own log files: training loss, validation loss, learning rate and throughput
against samples seen, across phases and restarts.

``dwb train`` writes one FileLogger file per process start (``logs/start{n}-rank0.txt``), so every file
after a run's first is a resume; the figure marks each with a dashed line, and each later phase starts where
the one before it ended (in samples seen) behind a solid line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from models.errors import WorkbenchError

LINE = re.compile(r"^\[metric\]\[batch=(\d+)\]: ([^:]+): (\S+)")
PANELS = (("training loss", ("loss/train/total",)),
          ("validation loss", ("validation/loss", "validation_ema/loss")),
          ("learning rate", ("lr-AdamW/group0",)),
          ("throughput (samples/s)", ("throughput/samples_per_sec",)))


@dataclass
class Segment:
    """One process start of one run: its metrics as {name: [(samples seen, value)]}."""
    run: str
    resumed: bool
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def start_files(run_dir: Path) -> list[Path]:
    def number(p: Path) -> int:
        return int(re.match(r"start(\d+)", p.name).group(1))

    return sorted((run_dir / "logs").glob("start*-rank0.txt"), key=number)


def read_log(path: Path, run: str, resumed: bool) -> Segment:
    """Composer's FileLogger lines; each metric placed at the sample count logged at its batch."""
    seg, samples_at = Segment(run, resumed), {}
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        batch, name, value = int(m.group(1)), m.group(2).strip(), m.group(3)
        try:
            x = float(value)
        except ValueError:
            continue
        if name == "time/sample":
            samples_at[batch] = int(x)
        rows.append((batch, name, x))
    per_batch = _samples_per_batch(samples_at)
    for batch, name, x in rows:
        seg.series.setdefault(name, []).append((samples_at.get(batch, batch * per_batch), x))
    return seg


def _samples_per_batch(samples_at: dict[int, int]) -> int:
    """Composer logs ``time/sample`` at a batch's start (samples before it); validation and the loss are logged
    at its end, so a batch's own samples are added by the constant batch size."""
    pairs = sorted(samples_at.items())
    return (pairs[-1][1] - pairs[0][1]) // (pairs[-1][0] - pairs[0][0]) if len(pairs) > 1 else 0


def read_run(run_dir: str | Path) -> list[Segment]:
    run_dir = Path(run_dir)
    files = start_files(run_dir)
    if not files:
        raise WorkbenchError(f"{run_dir}: no Composer log files (logs/start*-rank0.txt); train it with loggers: [file]")
    return [read_log(f, run_dir.name, i > 0) for i, f in enumerate(files)]


def laid_out(run_dirs: list[str | Path]) -> tuple[list[tuple[int, Segment, int]], dict]:
    """Each segment with its run's number and its offset in samples (a phase starts where the one before
    it ended), and the marks: {'phases': [samples], 'resumes': [samples]}."""
    offset, placed, marks = 0, [], {"phases": [], "resumes": []}
    for k, run_dir in enumerate(run_dirs):
        if k > 0:
            marks["phases"].append(offset)
        end = offset
        for seg in read_run(run_dir):
            xs = [x for s in seg.series.values() for x, _ in s]
            if seg.resumed and xs:
                marks["resumes"].append(min(xs) + offset)
            end = max([end] + [x + offset for x in xs])
            placed.append((k, seg, offset))
        offset = end
    return placed, marks


def plot_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """One figure of the four panels for runs given in order (phase 1, then phase 2 ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    placed, marks = laid_out(run_dirs)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for k, seg, offset in placed:
        for ax, (title, names) in zip(axes.flat, PANELS):
            for name, style in zip(names, ("-", ":")):
                points = seg.series.get(name, [])
                if points:
                    ax.plot([x + offset for x, _ in points], [y for _, y in points], style, color=f"C{k}",
                            marker="o" if len(points) < 20 else None, ms=3,
                            label=None if seg.resumed else f"{seg.run}: {name}")
    for ax, (title, _) in zip(axes.flat, PANELS):
        for x in marks["phases"]:
            ax.axvline(x, color="black", lw=1)
        for x in marks["resumes"]:
            ax.axvline(x, color="red", ls="--", lw=1)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("samples seen (black line: next phase; red dashes: resumed)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
