"""`dwb`: the workbench's command line, one subcommand per stage.

Each package registers its own subcommands; errors a user can fix print as one line
(``error: ...``) and a non-zero exit, tracebacks only with ``--debug``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings


def build_parser() -> argparse.ArgumentParser:
    from models import cli as models_cli
    from train import cli as train_cli

    parser = argparse.ArgumentParser(prog="dwb", description="diffusion-workbench: train, score, rate and serve "
                                     "text-to-image models (SD 1/2, SDXL, SD3, Flux.1).")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and library warnings")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train_cli.register(sub)
    models_cli.register(sub)
    for name in ("evaluate", "human_eval", "app", "demo"):  # packages that ship a command line register it here
        try:
            module = __import__(f"{name}.cli", fromlist=["register"])
        except ModuleNotFoundError:
            continue
        module.register(sub)
    return parser


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    for name in ("diffusers", "transformers", "composer", "streaming", "torch", "huggingface_hub", "datasets", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    if not debug:
        _quiet()
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, format="%(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place errors become messages
        if debug:
            raise
        if getattr(type(e), "user_facing", False):  # each package's error class for problems users can fix
            print(f"error: {e}", file=sys.stderr)
        else:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(f"error: {type(e).__name__}: {first} (run with --debug for the traceback)", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
