"""`dwb app`: serve the Gradio app on this machine (127.0.0.1 unless --host says otherwise)."""
from __future__ import annotations

import argparse
from pathlib import Path


def _at_least(low: int):
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {n}")
        return n

    return parse


def cmd_app(args) -> None:
    from train.errors import WorkbenchError

    from train.checkpoints import resolve_roots

    if args.max_size % 8:
        raise WorkbenchError(f"--max-size must be a multiple of 8, got {args.max_size}")
    roots = resolve_roots(args.checkpoints or ["."])  # before the slow imports: a typo fails at once

    from diffusers.utils import logging as diffusers_logging

    from .generate import Limits
    from .service import Runtime, Service
    from .ui import build_ui, launch

    diffusers_logging.disable_progress_bar()  # loading bars would fill the server's log
    output = None
    if args.output:
        output = Path(args.output).resolve()
        output.mkdir(parents=True, exist_ok=True)
    service = Service(roots, limits=Limits(max_steps=args.max_steps, max_size=args.max_size, max_batch=args.max_batch),
                      runtime=Runtime.pick(args.device, args.dtype), cache_size=args.cache_size, output=output,
                      workers=args.concurrency, allow_download=args.allow_download,
                      results=[Path(p).resolve() for p in args.results or []],
                      studies=[Path(p).resolve() for p in args.study or []])
    found = service.checkpoints()
    print(f"dwb app: {len(found)} checkpoint(s) under {', '.join(str(r) for r in roots)}; "
          f"{service.runtime.device}, {str(service.runtime.dtype).removeprefix('torch.')}", flush=True)
    demo = build_ui(service, concurrency=args.concurrency)
    launch(demo, host=args.host, port=args.port, queue_size=args.queue_size, concurrency=args.concurrency,
           max_upload_mb=args.max_upload_mb, upload_max_age=args.upload_max_age)


def register(sub) -> None:
    p = sub.add_parser("app", help="serve the Gradio app: generate and compare images from checkpoints",
                       description="A Gradio app on 127.0.0.1 that generates images from the checkpoints under "
                                   "--checkpoints (and nothing outside them): Composer files, mosaicml/diffusion "
                                   "checkpoints, diffusers folders, single files; hub ids from the local cache.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoints", nargs="+", action="extend", metavar="DIR",
                   help="folders whose checkpoints the app lists and may open (default: the current folder)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=_at_least(1), default=7860)
    p.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: float32 on CPU, bfloat16 (float16 without bf16 support) on a GPU")
    p.add_argument("--cache-size", type=_at_least(1), default=2, help="pipelines kept loaded (least recently used go)")
    p.add_argument("--concurrency", type=_at_least(1), default=1, help="generations running at once")
    p.add_argument("--queue-size", type=_at_least(1), default=16, help="requests waiting at most; more are refused")
    p.add_argument("--max-steps", type=_at_least(1), default=150)
    p.add_argument("--max-size", type=_at_least(16), default=1024, help="largest width or height (a multiple of 8)")
    p.add_argument("--max-batch", type=_at_least(1), default=8)
    p.add_argument("--output", metavar="DIR", help="also save every generated PNG under DIR/YYYY-MM-DD/")
    p.add_argument("--allow-download", action="store_true",
                   help="let users name hub ids that are not in the local Hugging Face cache (downloads them)")
    p.add_argument("--max-upload-mb", type=_at_least(1), default=8,
                   help="largest upload (a PNG for PNG Info, a prompt file); uploads are deleted once read")
    p.add_argument("--upload-max-age", type=_at_least(1), default=120, metavar="SECONDS",
                   help="uploads no event has read are deleted after this long")
    p.add_argument("--results", nargs="+", action="extend", metavar="DIR",
                   help="evaluate results stores (DIR/results.jsonl) to show scores from, besides those found "
                        "under --checkpoints")
    p.add_argument("--study", nargs="+", action="extend", metavar="DIR",
                   help="human-eval studies (DIR/report/results.json) to show win rates from")
    p.set_defaults(func=cmd_app)
