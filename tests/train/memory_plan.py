"""What a run's ranks held, as each wrote it beside its memory plan (``train.callbacks.memory``), read back."""
from __future__ import annotations

import json
from pathlib import Path

# The plan leaves out what is small beside the weights: FSDP's padding of a shard, AdamW's step counts, the
# model's and the EMA's buffers, the frozen towers' position ids (0.1-0.3% of a part in the tiny runs)
PLAN_TOLERANCE = 0.05


def memory_reports(run_dir: Path, ranks: int) -> list[dict]:
    """Each rank's report, rank 0 first."""
    return [json.loads((run_dir / "memory" / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def assert_each_rank_holds_its_plan(run_dir: Path, ranks: int) -> list[dict]:
    """Every part of every rank's plan (weights, gradients, AdamW state, EMA, frozen parts, preview copy) within
    ``PLAN_TOLERANCE`` of the bytes of the tensors the rank held, counted once every planned part was held."""
    reports = memory_reports(run_dir, ranks)
    for report in reports:
        assert report["complete"], f"rank {report['rank']} never held every part its plan counts: {report}"
        for part, planned in report["plan"].items():
            held = report["held"][part]
            assert abs(held - planned) <= PLAN_TOLERANCE * max(held, planned), (
                f"rank {report['rank']} at batch {report['batch']}: planned {planned:,} bytes of {part}, held {held:,}")
    return reports
