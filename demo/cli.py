"""`dwb demo [--quick]`."""
from __future__ import annotations

from pathlib import Path


def cmd_demo(args) -> None:
    from .run import run_demo

    run_demo(Path(args.out), quick=args.quick, seed=args.seed)


def register(sub) -> None:
    p = sub.add_parser("demo", help="every stage on the offline shapes domain, in minutes")
    p.add_argument("--out", default="demo-output")
    p.add_argument("--quick", action="store_true", help="the same stages in seconds (for tests)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
