"""The demo's cost table as a CPU user reads it: "GPUs" and "GPU-hours" that are CPU processes and a cost of "-",
with the reason under the table."""
from demo.run import CONFIGS, cost_text
from train.callbacks import plan_rows, schedule_samples, table
from train.config import load_config

CPU_IMAGES_PER_SEC = 2.1  # phase 2's measured throughput in `dwb demo --quick` on a busy 2-core CPU


def demo_report(trained_on: str) -> dict:
    """The cost part of demo.json as `curves_and_cost` writes it: the configs' real schedule at a CPU's pace."""
    samples = schedule_samples([load_config(CONFIGS / f"tiny-{phase}.yaml") for phase in ("phase1", "phase2")])
    rows = plan_rows({1: CPU_IMAGES_PER_SEC}, samples, [1], 0.95, None)
    return {"cost_table": table(rows, 0.95), "trained_on": trained_on, "schedule_process_hours": rows[0].gpu_hours,
            "final_checkpoint_cost": {"gpu_hours": 0.0045, "gpu_hours_total": 0.0089}}


def test_on_a_cpu_the_cost_table_says_what_it_counts():
    report = demo_report("cpu")
    lines = cost_text(report).splitlines()
    row = next(line for line in lines if line.endswith("| measured |"))
    assert row.split("|")[5] == " - "  # no dollars: what a CPU user saw, unexplained
    reason = lines[lines.index(row) + 1]  # the line right under the table
    assert reason.startswith("no GPU: the demo trained on the CPU")
    assert "GPUs are CPU processes" in reason and "no price per hour is set" in reason
    assert f"({report['schedule_process_hours']:.3g} for the schedule)" in reason


def test_on_a_gpu_the_table_stands_alone():
    assert "no GPU" not in cost_text(demo_report("gpu"))
