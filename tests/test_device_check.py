"""bench/device_check.py's parts under their time budgets: a part that overruns or fails is one line in the report,
the run goes on, and every part the run measured is in the JSON it writes, also when the run is cut short. The
whole script runs on the CPU in tests/test_bench.py (its --smoke is --dry-run)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import time

import pytest
import torch

from .conftest import REPO


@pytest.fixture(scope="module")
def device_check():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("device_check_under_test", REPO / "bench" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def test_a_part_over_its_budget_is_stopped_and_said_in_one_line(device_check):
    t0 = time.perf_counter()
    result = device_check.run_part("slow", lambda plan: time.sleep(30), device_check.DRY_RUN, 0.5)
    assert time.perf_counter() - t0 < 10
    assert result["status"] == "over budget"
    assert result["error"] == "OverBudget: over its budget of 0.5 s" and result["budget_seconds"] == 0.5


def test_a_failing_part_is_one_line_and_the_next_part_runs(device_check):
    def broken(plan):
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    failed = device_check.run_part("broken", broken, device_check.DRY_RUN, 30)
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: CUDA out of memory."
    fine = device_check.run_part("fine", lambda plan: {"images_per_s": 1.0}, device_check.DRY_RUN, 30)
    assert fine["status"] == "ok" and fine["images_per_s"] == 1.0
    assert "wall_seconds" in failed and "wall_seconds" in fine


def test_each_part_is_in_the_json_as_it_ends(device_check, tmp_path, monkeypatch):
    """A run killed after its first part (the machine's time ran out) leaves that part's figures on disk."""
    out = tmp_path / "dc.json"
    seen = []

    def first(plan):
        return {"figure": 1}

    def second(plan):
        seen.append(json.loads(out.read_text()))
        raise KeyboardInterrupt  # the run is cut short here

    monkeypatch.setattr(device_check, "PARTS", {"first": first, "second": second})
    monkeypatch.setattr(device_check, "DRY_RUN", dataclasses.replace(device_check.DRY_RUN,
                                                                     budgets={"first": 30, "second": 30}))
    monkeypatch.setattr(device_check, "versions", lambda: {})
    monkeypatch.setattr(device_check, "machine", lambda: {})
    monkeypatch.setattr(sys, "argv", ["device_check.py", "--dry-run", "--out", str(out), "--work", str(tmp_path)])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(device_check.RUN, "out", device_check.RUN.out)
    monkeypatch.setattr(device_check.RUN, "smoke", device_check.RUN.smoke)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(KeyboardInterrupt):
            device_check.main()
    finally:
        torch.set_num_threads(threads)  # the dry run's one thread, not this process's
    assert seen[0]["parts"]["first"]["status"] == "ok" and seen[0]["parts"]["first"]["figure"] == 1
    assert seen[0]["dry_run"] is True and seen[0]["complete"] is False


def test_every_carried_distribution_has_a_pin_in_the_lock(device_check):
    """The wheels for a GPU machine are downloaded from these lines: a name the lock stops pinning fails here,
    not on the machine."""
    pins = device_check.carried_pins()
    assert [p.split("==")[0] for p in pins] == device_check.CARRIED and all(p.split("==")[1] for p in pins)


def test_the_rehearsal_names_what_a_cuda_only_group_refuses_and_what_it_did_not_rehearse(device_check):
    """In a group that serves CUDA tensors only (NCCL's rule, here "cuda:gloo" on a machine without a GPU), every
    collective on CPU tensors is refused in one line; the report then leaves FSDP and the sharded save out of what it
    rehearsed, naming the collective FSDP needs."""
    import torch.distributed as dist

    dist.init_process_group("cuda:gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        tried = device_check.try_collectives("cpu")
    finally:
        dist.destroy_process_group()
    assert set(tried) == set(device_check.COLLECTIVES)
    for name in ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"):
        assert "No backend type associated with device type cpu" in tried[name] and "\n" not in tried[name]
    rank = {"backend": "cuda:gloo", "collectives": tried, "fsdp": False, "batches_run": 2}
    report = device_check.rehearsal([rank, rank], dataclasses.replace(device_check.DRY_RUN, rule_batches=2))
    assert "fsdp" not in report["rehearsed"] and "sharded_save" not in report["rehearsed"]
    assert "reduce_scatter_tensor" in report["not_rehearsed"]["fsdp"] and report["completed"]
