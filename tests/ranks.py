"""Multi-rank runs for the tests: Composer's launcher as users start it, with a bound on time that shows a hang.

Every rank starts with a watchdog (``faulthandler.dump_traceback_later``, installed by a ``sitecustomize`` on
the ranks' path): past ``hang_after`` seconds it writes that rank's Python stack of every thread to
``<logs>/stack-rank<R>.txt``, and 5 s later the rank exits. A test that hangs then fails with each rank's stack in its message,
in a bounded time, instead of waiting out CI.
"""
from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent

WATCHDOG = """\
import faulthandler, os, threading
_seconds = float(os.environ.get("DWB_TEST_HANG_AFTER", "0"))
if _seconds > 0 and os.environ.get("RANK") is not None:
    _stack = open(os.path.join(os.environ["DWB_TEST_LOGS"], "stack-rank%s.txt" % os.environ["RANK"]), "w")
    faulthandler.dump_traceback_later(_seconds, exit=False, file=_stack)  # every rank writes its stack ...
    _end = threading.Timer(_seconds + 5, os._exit, (3,))  # ... before any of them ends
    _end.daemon = True
    _end.start()
"""


@dataclass
class RankRun:
    returncode: int
    stdout: str
    stderr: str
    stacks: dict[int, str]  # rank -> its stack, for the ranks the watchdog stopped

    @property
    def hung(self) -> bool:
        return bool(self.stacks)

    def explain(self) -> str:
        if self.hung:
            return "ranks hung; their stacks:\n" + "\n".join(f"--- rank {r}\n{s}" for r, s in sorted(self.stacks.items()))
        return f"exit {self.returncode}\n{self.stderr[-3000:]}"


_PORTS = itertools.count(os.getpid())


def store_port() -> int:
    """A free port for a launch's rendezvous store, below the kernel's ephemeral range (32768 and up), so no socket
    another process opens meanwhile is given it, and in a range of its own for each pytest-xdist worker, so two
    launches at once never meet at one store (Composer's launcher takes any free port: a 2-rank precompute once
    lost its ranks' connections, "Connection closed by peer", while the other worker ran ranks of its own)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
    for _ in range(1000):
        port = 20000 + 1000 * (worker % 12) + next(_PORTS) % 1000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port for the ranks' store")


def launch(args: list[str], nproc: int, hang_after: float = 150, env: dict | None = None, node_rank: int | None = None,
           world_size: int | None = None, master_port: int | None = None, wrap: list[str] = (),
           logs: Path | None = None) -> subprocess.Popen:
    """``composer -n NPROC ARGS`` started (not waited for); ``wrap`` goes before it (``unshare -m ...``)."""
    logs = Path(logs or tempfile.mkdtemp(prefix="ranks-"))
    (logs / "sitecustomize.py").write_text(WATCHDOG)
    cmd = [*wrap, str(BIN / "composer"), "-n", str(nproc), "--stdout", str(logs / "out-rank{rank}.txt"),
           "--stderr", str(logs / "err-rank{rank}.txt"), "--master_port", str(master_port or store_port())]
    if world_size is not None:
        cmd += ["--world_size", str(world_size), "--node_rank", str(node_rank), "--master_addr", "127.0.0.1"]
    full_env = {**os.environ, **(env or {}), "DWB_TEST_HANG_AFTER": str(hang_after), "DWB_TEST_LOGS": str(logs),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(logs), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=full_env, start_new_session=True)  # its own group: kill_ranks ends every rank
    proc.logs = logs
    return proc


def kill_ranks(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank it started, as a machine that fails does."""
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def finish(proc: subprocess.Popen, hang_after: float = 150) -> RankRun:
    """Wait for a launched run; the watchdog ends hung ranks, and this bound ends a launcher left waiting."""
    try:
        out, err = proc.communicate(timeout=hang_after + 90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    stacks = {int(p.stem.split("rank")[1]): p.read_text() for p in proc.logs.glob("stack-rank*.txt") if p.read_text()}
    rank_err = "".join(p.read_text() for p in sorted(proc.logs.glob("err-rank*.txt")))
    return RankRun(proc.returncode, out, err + rank_err, stacks)


def run_ranks(args: list[str], nproc: int, hang_after: float = 150, **kwargs) -> RankRun:
    """``composer -n NPROC ARGS`` to its end, each rank's stack kept if it hung."""
    return finish(launch(args, nproc, hang_after, **kwargs), hang_after)


PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]  # a node's own /dev/shm, as a machine has


def run_nodes(args: list[str], nodes: int, nproc: int, hang_after: float = 150, private_shm: bool = True,
              env: dict | None = None) -> list[RankRun]:
    """``nodes`` launchers of ``nproc`` processes each on 127.0.0.1, as on separate machines (each in its own
    mount namespace with its own /dev/shm unless ``private_shm`` is False); one RankRun per node."""
    port = store_port()
    procs = [launch(args, nproc, hang_after, env=env, node_rank=n, world_size=nodes * nproc, master_port=port,
                    wrap=PRIVATE_SHM if private_shm else []) for n in range(nodes)]
    return [finish(p, hang_after) for p in procs]


def dwb_train_on_ranks(config: Path, overrides: list[str], nproc: int, hang_after: float = 150, **kwargs) -> RankRun:
    return run_ranks([str(BIN / "dwb"), "train", str(config), *map(str, overrides)], nproc, hang_after, **kwargs)
