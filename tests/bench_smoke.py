"""Runs bench scripts' smoke modes from one warm process: `python tests/bench_smoke.py OUT SCRIPT...`.

Importing torch, diffusers, transformers, Composer and Streaming is most of a smoke run's cost (about 16 s of
CPU of a script's 17-20 s), paid once here. Each script then runs in its own forked child exactly as
`python bench/SCRIPT --smoke --out OUT` runs it (as ``__main__``, with bench/ first on the path and its own
argv), two children at a time, with its stdout in OUT/SCRIPT.out and its stderr in OUT/SCRIPT.log. No
thread pool exists yet at the fork: torch starts its threads at the first parallel operation, which happens
in the children. Prints one JSON object: each script's exit status.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
SIDE_BY_SIDE = 2  # two children at a time: most of a smoke run keeps one core busy


def warm_imports() -> None:
    import composer  # noqa: F401
    import diffusers  # noqa: F401
    import streaming  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel  # noqa: F401
    from transformers import CLIPTextModel, CLIPTokenizer  # noqa: F401


def run_in_child(script: str, out: Path) -> int:
    """Fork; the child runs ``script`` as __main__, stdout in OUT/SCRIPT.out, stderr in OUT/SCRIPT.log.
    Returns the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        # stdout apart from stderr: a helper process (multiprocessing's resource tracker) may still write a
        # warning to stderr after the script printed its JSON
        for fd, suffix in ((1, "out"), (2, "log")):
            os.dup2(os.open(out / f"{script}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = [str(BENCH / script), "--smoke", "--out", str(out)]
        sys.path.insert(0, str(BENCH))
        try:
            runpy.run_path(str(BENCH / script), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        import atexit
        atexit._run_exitfuncs()  # a smoke run's temporary folders, as at a normal exit
    finally:
        os._exit(code)


def main() -> None:
    out, scripts = Path(sys.argv[1]), sys.argv[2:]
    warm_imports()
    waiting, running, status, seconds = list(scripts), {}, {}, {}
    while waiting or running:
        while waiting and len(running) < SIDE_BY_SIDE:
            script = waiting.pop(0)
            running[run_in_child(script, out)] = script
        pid, raw, usage = os.wait4(-1, 0)
        script = running.pop(pid)
        status[script] = os.waitstatus_to_exitcode(raw)
        seconds[script] = round(usage.ru_utime + usage.ru_stime, 1)
    (out / "cpu_seconds.json").write_text(json.dumps(seconds))  # each run's CPU time (its reaped children too)
    print(json.dumps(status))


if __name__ == "__main__":
    main()
