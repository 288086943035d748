"""Every collective of a launch's ranks runs in one place, ``models.common.ranks``, which puts its tensors on the
device the group's backend serves: NCCL serves CUDA tensors only, and validation's CPU float64 sums handed to
it stopped every multi-GPU run at its first evaluation ("No backend type associated with device type cpu")."""
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from models.common import collective_device
from models.errors import WorkbenchError

from .conftest import REPO

PACKAGES = ("train", "evaluate", "models", "app", "human_eval", "demo")
THE_ONE_PLACE = "models/common/ranks.py"
DIST_MODULES = ("torch.distributed", "composer.utils.dist")
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
               "all_to_all_single", "broadcast", "broadcast_object_list", "gather", "gather_object", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "barrier",
               "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv"}


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """Each name the module's imports bind (anywhere in it, functions included) -> the dotted name it stands for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, names)
        return f"{base}.{node.attr}" if base else None
    return None


def collectives_in(source: str) -> list[str]:
    """``line: dotted name`` of every use of a torch.distributed or Composer ``dist`` collective in ``source``."""
    tree = ast.parse(source)
    names = _imported_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node, names)
            if dotted and dotted.rsplit(".", 1)[-1] in COLLECTIVES and dotted.startswith(DIST_MODULES):
                found.append((node.lineno, dotted))
    return [f"{line}: {dotted}" for line, dotted in sorted(found)]


def test_the_scan_finds_collectives_however_they_are_imported():
    source = textwrap.dedent("""
        import torch
        import torch.distributed as tdist
        from torch.distributed import all_gather_object as gather_all
        from composer.utils import dist

        def f(t):
            from composer.utils.dist import barrier
            dist.all_reduce(t, reduce_operation="MAX")
            tdist.broadcast_object_list([t], src=0)
            torch.distributed.barrier()
            gather_all([None], t)
            barrier()
            reducer = tdist.all_reduce
            dist.get_global_rank(), tdist.is_initialized(), torch.distributed.fsdp.FullyShardedDataParallel
            functools.reduce(max, [1]), np.broadcast_to(t, (2,))
        """)
    assert collectives_in(source) == ["9: composer.utils.dist.all_reduce", "10: torch.distributed.broadcast_object_list",
                                      "11: torch.distributed.barrier", "12: torch.distributed.all_gather_object",
                                      "13: composer.utils.dist.barrier", "14: torch.distributed.all_reduce"]


def test_every_collective_of_the_project_runs_in_the_ranks_module():
    files = sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py")) + [REPO / "dwb.py"]
    # a collective is reached only through an import naming torch's distributed or composer: other files unparsed
    sources = {p: text for p in files if "distributed" in (text := p.read_text()) or "composer" in text}
    around = {str(p.relative_to(REPO)): uses for p, text in sources.items() if (uses := collectives_in(text))}
    assert set(around) == {THE_ONE_PLACE}, {k: v for k, v in around.items() if k != THE_ONE_PLACE}
    assert len(around[THE_ONE_PLACE]) >= 4  # the scan reads the one place's own (a sum, a barrier, broadcast, gather)


@pytest.mark.parametrize("backend, device", [
    ("nccl", "cuda"),  # Composer's GPU device: CUDA tensors only
    ("cuda:gloo", "cuda"),  # NCCL's device map with gloo behind it: a CUDA-only group
    ("gloo", "cpu"),
    ("cpu:gloo,cuda:nccl", "cpu"),
    ("CUDA:NCCL", "cuda"),
])
def test_a_tensor_kept_on_the_cpu_goes_where_the_backend_serves_it(backend, device):
    assert collective_device(backend, "cpu") == device


@pytest.mark.parametrize("backend", ["nccl", "cuda:gloo", "cpu:gloo,cuda:nccl", "gloo"])
def test_a_tensor_on_the_gpu_stays_there_where_the_backend_serves_it(backend):
    """The guard's flag lives on the GPU: moved to the CPU for a collective, it would wait for the GPU's work."""
    assert collective_device(backend, "cuda") == "cuda"


def test_a_gpu_tensor_goes_to_the_cpu_on_a_group_that_serves_only_the_cpu():
    assert collective_device("cpu:gloo", "cuda") == "cpu"


def test_a_backend_serving_no_known_device_is_one_line():
    with pytest.raises(WorkbenchError, match="^the process group's backend 'carrier-pigeon' serves no device"):
        collective_device("carrier-pigeon")


SUM_ON_A_CUDA_ONLY_GROUP = """
import os, torch, torch.distributed as dist
from models.common import all_reduce
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("cuda:gloo", rank=0, world_size=1)  # a group that serves CUDA tensors only, as NCCL's
sums = torch.tensor([[0.1, 3.0], [1e-17, 1.0]], dtype=torch.float64)
try:
    dist.all_reduce(sums.clone())
except RuntimeError as e:
    print("cpu refused:", e)
out = all_reduce(sums.clone())
print(out.device.type, out.dtype, out.tolist() == sums.tolist())
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a group that serves CUDA only needs a CUDA device")
def test_a_float64_sum_on_a_group_that_serves_cuda_only_comes_back_exact():
    from .ranks import store_port

    done = subprocess.run([sys.executable, "-c", SUM_ON_A_CUDA_ONLY_GROUP], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "PORT": str(store_port())})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cpu refused: No backend type associated with device type cpu" in done.stdout
    assert done.stdout.strip().endswith("cpu torch.float64 True")
