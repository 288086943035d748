"""`dwb human-eval create | serve | report`: build a blind A/B study, rate it in a browser, analyse the votes."""
from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
from pathlib import Path

from .errors import HumanEvalError
from .limits import DEFAULT_MAX_MEGAPIXELS, MAX_SIDE

TOKEN_ENV = "DWB_HUMAN_EVAL_TOKEN"
REQUEST_TIMEOUT_S = 10.0  # a request is under 5 KiB (bodies over 4 KiB are refused): 10 s allows 4 kbit/s
MAX_CONNECTIONS = 1000  # a browser opens up to 6 connections to one server: room for 160 raters at once


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return n


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return n


def _fraction(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return x


def _image_size(value: str) -> tuple[int, int]:
    """`N` (square) or `WIDTHxHEIGHT`, in pixels."""
    parts = value.lower().split("x")
    if len(parts) in (1, 2) and all(p.isdigit() and 0 < int(p) <= 8192 for p in parts):
        return int(parts[0]), int(parts[-1])
    raise argparse.ArgumentTypeError(f"must be N or WIDTHxHEIGHT in pixels (1 to 8192), got {value}")


def _above_zero(unit: str, most: float):
    """An argparse type: a number above 0 and at most ``most`` (of ``unit``)."""
    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = 0.0
        if not 0 < x <= most:
            raise argparse.ArgumentTypeError(f"must be a number of {unit} above 0 (at most {most:g}), got {value}")
        return x
    return parse


_megapixels = _above_zero("megapixels", 1000)
_seconds = _above_zero("seconds", 3600)


def _proxy_address(value: str) -> str:
    """An IP address or a network (CIDR), written as uvicorn compares it (it takes 10.0.0.1/8 for a name)."""
    try:
        if "/" in value:
            return str(ipaddress.ip_network(value, strict=False))
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address or network: {value!r}") from None


def _covariates(value: str) -> tuple[str, ...]:
    from .statistics.style_control import COVARIATES

    names = COVARIATES if value == "all" else tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in COVARIATES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown covariate {', '.join(unknown) or value!r} "
                                          f"(choose from {', '.join(COVARIATES)}, or all)")
    return names


def _labelled(value: str) -> tuple[str | None, Path]:
    """`PATH` or `LABEL=PATH`; a path that exists as given wins over splitting at '='."""
    if "=" in value and not Path(value).exists():
        label, path = value.split("=", 1)
        return label.strip() or None, Path(path)
    return None, Path(value)


def _named(samples: list, label: str | None) -> list:
    """Samples as their label names them: an entry ``BASE + FILE@S`` named and hashed as the entry is."""
    from models.checkpoints import is_entry

    from .samples import named_as_entry

    return named_as_entry(samples, label) if label is not None and is_entry(label) else samples


def cmd_create(args) -> None:
    from .samples import read_folder, read_manifest
    from .study import build_study

    if not args.samples and not args.folder:
        raise HumanEvalError("nothing to compare: pass --samples MANIFEST (from `dwb evaluate`) or --folder DIR --prompts SET")
    if args.folder and not args.prompts:
        raise HumanEvalError("--folder needs --prompts: drawbench, parti, or a CSV/TSV with a 'prompt' column "
                             "(optionally 'category')")
    samples = []
    for label, path in map(_labelled, args.samples or []):
        samples += _named(read_manifest(path, model=label), label)
    for label, path in map(_labelled, args.folder or []):
        samples += _named(read_folder(path, args.prompts, model=label), label)
    study, summary = build_study(samples, args.study, gold=args.gold, repeats=args.repeats, per_rater=args.per_rater,
                                 images_per_prompt=args.images_per_prompt, seed=args.seed, allocation=args.allocation,
                                 target_width=args.target_width, image_size=args.image_size,
                                 max_megapixels=args.max_megapixels, ties=args.ties)
    per_pair = ", ".join(f"{k}: {v}" for k, v in summary["pairs_per_model_pair"].items())
    print(f"study {study.folder}: {len(summary['models'])} models, {summary['prompts']} prompts, {summary['pairs']} pairs "
          f"({per_pair}), {summary['gold']} gold, {summary['repeats']} repeated; {summary['images_written']} images "
          f"at {'x'.join(map(str, summary['image_size']))} px")
    for model, n in summary["unmatched_images"].items():
        if n:
            print(f"note: {n} images of '{model}' have no counterpart in another model and are not used")
    print(f"next: dwb human-eval serve {study.folder}")


def _checked_token(token: str, source: str) -> str:
    from .admin import token_problem

    if problem := token_problem(token):
        raise HumanEvalError(f"the admin token from {source} {problem}")
    return token


def _write_token_file(path: Path) -> None:
    """A new random token in `path`, mode 0600, appearing whole or not at all (another instance may race us)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails if the file exists: the first instance's token wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _admin_token(args, study_dir: Path) -> tuple[str, str]:
    """The dashboard's token and where it comes from, for the start-up line (which never shows the token)."""
    if args.admin_token is not None:
        return _checked_token(args.admin_token, "--admin-token"), "the one given with --admin-token"
    if os.environ.get(TOKEN_ENV):
        return _checked_token(os.environ[TOKEN_ENV], f"${TOKEN_ENV}"), f"${TOKEN_ENV}"
    path = study_dir / "admin_token"
    if not path.exists():
        _write_token_file(path)
    return _checked_token(path.read_text().strip(), f"{path} (delete it to get a new one)"), f"in {path}"


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # IPPROTO_TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise HumanEvalError(f"cannot listen on {host}:{port}: {e.strerror} (is another server running? pass --port)") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def cmd_serve(args) -> None:
    from .study import load_study

    study = load_study(args.study)
    missing = [f for f in study.image_files().values() if not f.is_file()]  # image_files refuses any outside the study
    if missing:
        raise HumanEvalError(f"{len(missing)} study images are missing, e.g. {missing[0]} (copy the whole study folder)")
    token, token_source = _admin_token(args, study.folder)  # before the database is touched: a bad token changes nothing

    import uvicorn

    from .network import allow_open_files, uvicorn_config
    from .server import create_app
    from .store import Store, database_url

    allow_open_files(args.max_connections)
    url = database_url(args.db or study.folder / "votes.sqlite")
    store = Store(url, study.id)
    app = create_app(study, store, token, per_rater=args.per_rater, new_raters_per_minute=args.new_raters_per_minute,
                     secure_cookie=args.secure_cookie)
    sock = _listen(args.host, args.port)
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving {len(study.pairs)} pairs of {study.folder} (votes: {url})\n"
          f"  raters: http://{shown}:{port}/   (or /?rater=ID)\n"
          f"  admin:  http://{shown}:{port}/admin?token=TOKEN   (TOKEN: {token_source})", flush=True)
    config = uvicorn_config(app, trusted_proxies=args.trusted_proxy, request_timeout=args.request_timeout,
                            max_connections=args.max_connections)
    uvicorn.Server(config).run(sockets=[sock])


def cmd_links(args) -> None:
    from urllib.parse import urlencode

    from .raters import valid_rater_id
    from .study import load_study

    study = load_study(args.study)
    ids = list(args.raters)
    if args.from_file:
        if not Path(args.from_file).is_file():
            raise HumanEvalError(f"rater id file not found: {args.from_file}")
        ids += [line.strip() for line in Path(args.from_file).read_text().splitlines() if line.strip()]
    if not ids:
        raise HumanEvalError("no rater ids: pass them as arguments or with --from-file")
    for rater in ids:
        if not valid_rater_id(rater):
            raise HumanEvalError(f"rater id {rater!r}: use 1-64 letters, digits, '.', '_', '@' or '-'")
    print("rater,url")
    for rater in ids:
        print(f"{rater},{args.base_url.rstrip('/')}/?{urlencode({'rater': rater, 'key': study.rater_key(rater)})}")


def cmd_report(args) -> None:
    from .scores import read_scores
    from .study import load_study

    study = load_study(args.study)
    scores = read_scores(args.results) if args.results else None  # a wrong path fails before anything is written

    from .analysis import analyze
    from .joined import humans_beside_metrics
    from .joined_page import joined_lines, write_joined
    from .report import summary, write_report
    from .store import Store, database_url

    store = Store(database_url(args.db or study.folder / "votes.sqlite"), study.id, create=False)
    votes = store.all_votes()
    if not votes:
        raise HumanEvalError(f"no votes yet in {store.url}")
    labels = store.labels()
    results = analyze(study, votes, exclude_failing=args.exclude_failing_raters, gold_threshold=args.gold_threshold,
                      n_boot=args.bootstrap, seed=args.seed, target_width=args.target_width or study.target_width,
                      covariates=args.covariates, labels=labels, progress=True)
    out = args.out or study.folder / "report"
    paths = write_report(study, votes, results, out, interval=args.interval, labels=labels)
    print(summary(results, args.interval))
    if scores is not None:
        joined = humans_beside_metrics(study, votes, scores, excluded=set(results["counts"]["excluded_raters"]),
                                       n_boot=args.bootstrap, seed=args.seed)
        paths.update(write_joined(joined, out))
        print("\n".join(joined_lines(joined)))
    print("wrote " + ", ".join(str(p) for p in paths.values()))


def register(sub) -> None:
    he = sub.add_parser("human-eval", help="blind pairwise A/B rating in the browser, with confidence intervals")
    he_sub = he.add_subparsers(dest="human_eval_command", required=True, metavar="HUMAN_EVAL_COMMAND")
    for add in (_add_create, _add_serve, _add_links, _add_report):
        add(he_sub)


def _add_create(sub) -> None:
    p = sub.add_parser("create", help="build a study from sample manifests or image folders")
    p.add_argument("study", help="a new folder for the study")
    p.add_argument("--samples", action="append", metavar="[LABEL=]MANIFEST",
                   help="a manifest.jsonl from `dwb evaluate` (repeatable; one per model, or several models in one); "
                        "LABEL may be an entry \"BASE + LORA@S\" as `dwb evaluate run` takes it: the images are "
                        "named and hashed as that entry (AUTOMATIC1111's names: the base, each LoRA's stem and short "
                        "hash, its strength)")
    p.add_argument("--folder", action="append", metavar="[LABEL=]DIR",
                   help="a folder of one model's images named <prompt_index>_<image_index>.png (repeatable; LABEL "
                        "as for --samples, an entry too)")
    p.add_argument("--prompts", metavar="SET", help="the prompts of --folder images: drawbench or parti (shipped), or "
                                                   "a CSV/TSV file with 'prompt' and 'category' columns")
    p.add_argument("--gold", type=_count, default=0, help="gold pairs (attention checks with a known answer)")
    p.add_argument("--repeats", type=_count, default=0, help="pairs shown twice, for self-consistency")
    p.add_argument("--per-rater", type=_positive, help="the most pairs one rater is given (default: all)")
    p.add_argument("--images-per-prompt", type=_positive, help="use only image_index 0..K-1 of each prompt")
    p.add_argument("--seed", type=int, default=0, help="for choosing gold and repeated pairs")
    p.add_argument("--allocation", choices=("uniform", "adaptive"), default="uniform",
                   help="adaptive: each showing goes to the model pair whose interval is widest for its distance "
                        "from 50%% (default: uniform)")
    p.add_argument("--target-width", type=_fraction, default=0.1,
                   help="the stopping rule's interval width, e.g. 0.1 for +-5 points (default)")
    p.add_argument("--ties", choices=("one", "good_bad"), default="one",
                   help="one: a tie is 'no preference', as in DrawBench (default); good_bad: raters say 'both good' "
                        "or 'both bad' instead, and the report gives each model's both-bad rate")
    p.add_argument("--image-size", type=_image_size, metavar="N|WxH",
                   help="the one size every image is shown at, so that size tells no model apart (default: the "
                        f"largest image's, shrunk to fit {MAX_SIDE}x{MAX_SIDE}; others are resized with Lanczos)")
    p.add_argument("--max-megapixels", type=_megapixels, default=DEFAULT_MAX_MEGAPIXELS, metavar="MP",
                   help="refuse images with more pixels than this, read from their headers before any is decoded "
                        f"(default {DEFAULT_MAX_MEGAPIXELS:g}: 4096x4096; re-encoding one takes about 15 bytes a "
                        "pixel)")
    p.set_defaults(func=cmd_create)


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve a study to raters (FastAPI under uvicorn)")
    p.add_argument("study")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept raters from other machines")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--db", help="SQLAlchemy URL or SQLite file (default: STUDY/votes.sqlite); "
                                "postgresql+psycopg://... lets several instances share one store")
    p.add_argument("--admin-token", help=f"the dashboard's token (default: ${TOKEN_ENV}, else STUDY/admin_token)")
    p.add_argument("--secure-cookie", action="store_true",
                   help="mark the admin cookie Secure, sent over https only (default: only for requests that came "
                        "over https, as a --trusted-proxy's X-Forwarded-Proto says)")
    p.add_argument("--per-rater", type=_positive, help="override the study's cap on pairs per rater")
    p.add_argument("--new-raters-per-minute", type=_count, default=60,
                   help="new raters one client address may start a minute (default 60; 0: no limit)")
    p.add_argument("--trusted-proxy", nargs="+", type=_proxy_address, default=[], metavar="ADDR",
                   help="reverse proxies (IP addresses or networks) whose X-Forwarded-For and X-Forwarded-Proto are "
                        "believed (default: none; the header of anyone else is ignored)")
    p.add_argument("--request-timeout", type=_seconds, default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help="close a connection whose request (head and body) has not arrived this long after its first "
                        f"byte or the connection (default {REQUEST_TIMEOUT_S:g})")
    p.add_argument("--max-connections", type=_positive, default=MAX_CONNECTIONS, metavar="N",
                   help=f"close connections beyond N open at once as they open (default {MAX_CONNECTIONS})")
    p.set_defaults(func=cmd_serve)


def _add_links(sub) -> None:
    p = sub.add_parser("links", help="per-rater links (id and key) for raters you know in advance")
    p.add_argument("study")
    p.add_argument("raters", nargs="*", help="rater ids, e.g. crowd worker ids")
    p.add_argument("--from-file", metavar="FILE", help="more rater ids, one a line")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="where the study is served")
    p.set_defaults(func=cmd_links)


def _add_report(sub) -> None:
    from .chart import DEFAULT_INTERVAL, INTERVALS
    from .statistics.resampling import DESIGN_EFFECT_REPLICATES, REPORT_BOOTSTRAP

    p = sub.add_parser("report", help="preference rates, intervals, Bradley-Terry, agreement; CSV, JSON and PNG")
    p.add_argument("study")
    p.add_argument("--db", help="SQLAlchemy URL or SQLite file (default: STUDY/votes.sqlite)")
    p.add_argument("--out", help="output folder (default: STUDY/report)")
    p.add_argument("--exclude-failing-raters", action="store_true", help="leave out raters under --gold-threshold")
    p.add_argument("--gold-threshold", type=_fraction, default=0.8, help="gold pass rate a rater needs (default 0.8)")
    p.add_argument("--bootstrap", type=_positive, default=REPORT_BOOTSTRAP,
                   help=f"resamples of the bootstrap intervals beside the headline one (by prompt, by rater, "
                        f"Bradley-Terry; default {REPORT_BOOTSTRAP}, as on the admin page); the headline interval's "
                        f"design effect always takes {DESIGN_EFFECT_REPLICATES} with its own seed, so every surface "
                        f"gives the same digits")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-width", type=_fraction,
                   help="the planner's and the stopping rule's interval width, e.g. 0.1 for +-5 points "
                        "(default: the study's, set by create)")
    p.add_argument("--covariates", type=_covariates, default=(), metavar="NAMES",
                   help="also fit Bradley-Terry controlling for image brightness, saturation, file_bytes, pixels "
                        "(comma-separated, or all)")
    p.add_argument("--interval", choices=INTERVALS, default=DEFAULT_INTERVAL,
                   help="the chart's error bars and a second interval in the summary (default clustered_wilson: "
                        "Wilson on the votes' effective number, clustering by prompt and rater counted)")
    p.add_argument("--results", action="append", metavar="EVAL_OUT",
                   help="an evaluate output folder (its results.jsonl) scoring the study's checkpoints (repeatable): "
                        "also writes joined.html/json/csv, humans beside metrics, joined by checkpoint hash")
    p.set_defaults(func=cmd_report)
