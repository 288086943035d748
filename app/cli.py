"""`dwb app`: serve the Gradio app on this machine (127.0.0.1 unless --host says otherwise)."""
from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

from models.generation import MAX_SIZE, MAX_STEPS, MIN_SIZE

from .uploads import MAX_CLIENT_UPLOAD_MB, MAX_TOTAL_UPLOAD_MB


# A request (head and body) must arrive within this: an upload of --max-upload-mb's 8 MB at 1.1 Mbit/s.
REQUEST_TIMEOUT_S = 60
MAX_CONNECTIONS = 1000  # a browser opens up to 6 connections to one server: room for 160 people at once


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


def _count(value: str) -> int:
    """A positive whole number, with k, M or G for thousands, millions, billions ("250M")."""
    scale = {"k": 10**3, "M": 10**6, "G": 10**9}.get(value[-1:], 1)
    try:
        n = float(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 250M, got {value!r}") from None
    if not 1 <= n < 2**63 or n != int(n):
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value!r}")
    return int(n)


def _address(value: str) -> str:
    """An IP address or network (what uvicorn's FORWARDED_ALLOW_IPS takes)."""
    try:
        return str(ipaddress.ip_network(value, strict=False) if "/" in value else ipaddress.ip_address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address or network, got {value!r}") from None


class DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default said once: added to its help unless the help says it already, and never "None" or
    "False" (an option with nothing to show)."""

    def _get_help_string(self, action) -> str:
        if "(default" in (action.help or "") or action.default in (None, False):
            return action.help or ""
        return super()._get_help_string(action)


def cmd_app(args) -> None:
    from models.errors import WorkbenchError

    from models.checkpoints import resolve_roots

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
    runtime = Runtime.pick(args.device, args.dtype)
    limits = Limits.for_device(runtime.device, max_steps=args.max_steps, max_size=args.max_size,
                               max_batch=args.max_batch, max_pixel_steps=args.max_pixel_steps,
                               max_client_requests=args.max_client_requests,
                               max_client_pixel_steps=args.max_client_pixel_steps)
    service = Service(roots, limits=limits, runtime=runtime, cache_size=args.cache_size, output=output,
                      workers=args.concurrency, allow_download=args.allow_download,
                      results=[Path(p).resolve() for p in args.results or []],
                      studies=[Path(p).resolve() for p in args.study or []])
    found = service.checkpoints()
    print(f"dwb app: {len(found)} checkpoint(s) under {', '.join(str(r) for r in roots)}; "
          f"{service.runtime.device}, {str(service.runtime.dtype).removeprefix('torch.')}; at most "
          f"{limits.max_pixel_steps:,} pixel-steps a request", flush=True)
    demo, uploads = build_ui(service, concurrency=args.concurrency, max_client_upload_mb=args.max_client_upload_mb,
                             max_total_upload_mb=args.max_total_upload_mb)
    launch(demo, uploads, host=args.host, port=args.port, queue_size=args.queue_size, concurrency=args.concurrency,
           max_upload_mb=args.max_upload_mb, upload_max_age=args.upload_max_age,
           trusted_proxies=args.trusted_proxy or [], request_timeout=args.request_timeout,
           max_connections=args.max_connections, results_folders=service.scores.results_folders)


def register(sub) -> None:
    p = sub.add_parser("app", help="serve the Gradio app: generate and compare images from checkpoints",
                       description="A Gradio app on 127.0.0.1 that generates images from the checkpoints under "
                                   "--checkpoints (and nothing outside them): Composer files, mosaicml/diffusion "
                                   "checkpoints, diffusers folders, single files; hub ids from the local cache.",
                       formatter_class=DefaultsOnce)
    p.add_argument("--checkpoints", nargs="+", action="extend", metavar="DIR",
                   help="folders whose checkpoints the app lists and may open (default: the current folder)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=_at_least(1), default=7860, help="port to serve on")
    p.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: float32 on CPU, bfloat16 (float16 without bf16 support) on a GPU")
    p.add_argument("--cache-size", type=_at_least(1), default=2, help="pipelines kept loaded (least recently used go)")
    p.add_argument("--concurrency", type=_at_least(1), default=1, help="generations running at once")
    p.add_argument("--queue-size", type=_at_least(1), default=16, help="requests waiting at most; more are refused")
    p.add_argument("--max-steps", type=_at_least(1), default=MAX_STEPS, help="most denoising steps a request may ask")
    p.add_argument("--max-size", type=_at_least(MIN_SIZE), default=MAX_SIZE, help="largest width or height (a multiple of 8)")
    p.add_argument("--max-batch", type=_at_least(1), default=8,
                   help="most images one request may ask (Generate's batch, X/Y/Z's cells per call)")
    p.add_argument("--max-pixel-steps", type=_count, metavar="N",
                   help="most work one request may ask: width x height x steps, summed over its images (an X/Y/Z "
                        "plot: over its cells); k, M, G: thousands, millions, billions (default: 8M on a CPU, "
                        "250M on a GPU)")
    p.add_argument("--max-client-requests", type=_at_least(1), default=4,
                   help="requests one client (address) may have waiting or running at once")
    p.add_argument("--max-client-pixel-steps", type=_count, metavar="N",
                   help="pixel-steps one client may have waiting or running at once (default: twice "
                        "--max-pixel-steps)")
    p.add_argument("--trusted-proxy", nargs="+", action="extend", type=_address, metavar="ADDR",
                   help="addresses (or networks) of reverse proxies whose X-Forwarded-For names the client; "
                        "without it none is, and a client is its peer address")
    p.add_argument("--request-timeout", type=_at_least(1), default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help="close a connection whose request (head and body) has not arrived this long after its first "
                        "byte or the connection (the default lets an 8 MB upload arrive at 1.1 Mbit/s)")
    p.add_argument("--max-connections", type=_at_least(1), default=MAX_CONNECTIONS, metavar="N",
                   help="close connections beyond N open at once as they open")
    p.add_argument("--output", metavar="DIR", help="also save every generated PNG under DIR/YYYY-MM-DD/")
    p.add_argument("--allow-download", action="store_true",
                   help="let users name hub ids that are not in the local Hugging Face cache (downloads them)")
    p.add_argument("--max-upload-mb", type=_at_least(1), default=8,
                   help="largest upload (a PNG for PNG Info, a prompt file); uploads are deleted once read")
    p.add_argument("--max-client-upload-mb", type=_at_least(1), default=MAX_CLIENT_UPLOAD_MB,
                   help="uploads one client (address) may have on the server at once, received or being received")
    p.add_argument("--max-total-upload-mb", type=_at_least(1), default=MAX_TOTAL_UPLOAD_MB,
                   help="uploads the server keeps at once, all clients together")
    p.add_argument("--upload-max-age", type=_at_least(1), default=120, metavar="SECONDS",
                   help="uploads no event has read are deleted after this long")
    p.add_argument("--results", nargs="+", action="extend", metavar="DIR",
                   help="evaluate results stores (DIR/results.jsonl) to show scores from, besides those found "
                        "under --checkpoints")
    p.add_argument("--study", nargs="+", action="extend", metavar="DIR",
                   help="human-eval studies (DIR/report/results.json) to show win rates from")
    p.set_defaults(func=cmd_app)
