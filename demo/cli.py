"""`dwb demo [--quick]`."""
from __future__ import annotations

from pathlib import Path

from models.generation import DEFAULT_GUIDANCE


def cmd_demo(args) -> None:
    from .run import run_demo

    run_demo(Path(args.out), quick=args.quick, seed=args.seed, with_transformer=args.with_transformer)


def register(sub) -> None:
    from .settings import generation

    full, quick = generation(), generation(quick=True)
    p = sub.add_parser("demo", help="every stage on the offline shapes domain, in minutes",
                       description=f"Grids and scores at guidance {full['guidance']:g} (where the tiny model draws "
                                   f"best; the workbench's default is {DEFAULT_GUIDANCE:g}), {full['steps']} steps "
                                   f"({quick['steps']} with --quick), {full['sampler']}, {full['weights']} weights "
                                   "(EMA: every demo checkpoint holds them); demo.json records them.")
    p.add_argument("--out", default="demo-output")
    p.add_argument("--quick", action="store_true", help="the same stages in seconds (for tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--with-transformer", action="store_true",
                   help="also train the tiny MMDiT with rectified flow for the UNet's training FLOPs (counted) and "
                        "compare the two last checkpoints with paired intervals (a few minutes more)")
    p.set_defaults(func=cmd_demo)
