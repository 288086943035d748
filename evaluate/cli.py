"""`dwb evaluate run|watch|report`: score checkpoints, watch a run, rebuild the report."""
from __future__ import annotations

import argparse

from train.samplers import SAMPLERS


def _guidance(value: str) -> tuple[float, ...]:
    try:
        scales = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated guidance scales such as 1.5,3,5,8, got {value!r}") from None
    if any(g < 0 for g in scales):
        raise argparse.ArgumentTypeError("guidance scales must be non-negative")
    return scales


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return n


def _replicates(value: str) -> int:
    n = int(value)
    if n < 0 or n == 1:
        raise argparse.ArgumentTypeError(f"must be 0 (no intervals) or at least 2 replicates, got {value}")
    return n


def _config(args):
    from .run import EvalConfig

    return EvalConfig(out=args.out, reference=args.reference, inception_weights=args.inception_weights, scorer=args.scorer,
                      prompts=args.prompts, n_prompts=args.n_prompts, n_per_prompt=args.n_per_prompt,
                      n_reference=args.n_reference, guidance=args.guidance, steps=args.steps, scheduler=args.sampler,
                      size=args.size, batch_size=args.batch_size, seed=args.seed, clip=args.clip, cmmd=args.cmmd,
                      dinov2=args.dinov2, bootstrap=args.bootstrap, ema=args.ema,
                      kid_subsets=args.kid_subsets, kid_subset_size=args.kid_subset_size, device=args.device,
                      dtype=args.dtype, allow_fewer_reference=args.allow_fewer_reference, cache=args.cache,
                      feature_dim=args.inception_features)


def _with_interval(r: dict, key: str, fmt: str) -> str:
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    return format(r[key], fmt) + (f" [{lo:{fmt}}, {hi:{fmt}}]" if lo is not None else "")


def _summary(rows: list[dict]) -> None:
    from .attribute_accuracy import HEADLINE_COLUMNS, attr_column

    for r in rows:
        clip = f", CLIP {_with_interval(r, 'clip_score', '.2f')}" if r.get("clip_score") is not None else ""
        if r.get("cmmd") is not None:
            clip += f", CMMD {_with_interval(r, 'cmmd', '.4f')}"
        if r.get("fd_dinov2") is not None:
            clip += f", FD-DINOv2 {_with_interval(r, 'fd_dinov2', '.3f')}"
        attrs = ""
        if r.get(attr_column("all", "all")) is not None:
            color, shape, count, position, one_object, every = (r.get(c, float("nan")) for c in HEADLINE_COLUMNS)
            attrs = (f", one group: colour {color:.2f} shape {shape:.2f} count {count:.2f}, position {position:.2f},"
                     f" all right: one object {one_object:.2f}, every prompt {every:.2f}")
        fid = "domain FID" if str(r.get("extractor", "")).startswith("shapes-scorer") else "FID"
        inf = f", FD-inf {r['fid_infinity']:.3f}" if r.get("fid_infinity") is not None else ""
        print(f"{r['model']} cfg {r['guidance']:g}: {fid} {_with_interval(r, 'fid', '.3f')}{inf}, "
              f"KID {_with_interval(r, 'kid_mean', '.5f')}{clip}{attrs} ({r['n_images']} images, {r['seconds_total']:.1f} s)")


def cmd_run(args) -> None:
    from composer.utils import dist

    from .run import evaluate_checkpoints

    rows = evaluate_checkpoints(_config(args), args.checkpoints)
    if dist.get_global_rank() == 0:
        _summary(rows)
        print(f"results in {args.out}/results.jsonl (CSV: results.csv), report: {args.out}/report/index.html")


def cmd_watch(args) -> None:
    from .report import write_report
    from .run import Evaluator
    from .watch import Watcher

    ev = Evaluator(_config(args))

    def score(ckpt) -> None:
        _summary(ev.score(ckpt))
        ev.store.export_csv()
        write_report(args.out)

    Watcher(args.run_dir, ev.store, score, ev.record_unreadable, settle=args.settle,
            retry_unreadable=args.retry_unreadable).run_forever(interval=args.interval, max_polls=args.max_polls)


def cmd_train_scorer(args) -> None:
    from train.shapes.scorer import train_scorer

    info = train_scorer(args.data, args.out, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                        seed=args.seed, progress=not args.no_progress)
    held = info.get("held_out")
    if held:
        print("held-out accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in held.items())
              + f" ({info['n_held_out']} images)")
    print(f"wrote {args.out} ({info['seconds']:.0f} s training)")


def cmd_compare(args) -> None:
    from .compare import check_replicates, compare_store, rows_of, write_comparison
    from .store import ResultsStore

    check_replicates(args.bootstrap)
    missing = [c for c in (args.a, args.b) if not rows_of(ResultsStore(args.out).rows(), c)]
    if missing:  # score what the store does not hold yet, with the same prompts and seeds
        from train.errors import WorkbenchError

        from .run import evaluate_checkpoints

        if args.reference is None:
            raise WorkbenchError(f"{missing[0]} has no scored rows in {args.out}/results.jsonl: give --reference and "
                                 f"--inception-weights or --scorer to score it")
        _summary(evaluate_checkpoints(_config(args), missing))
    for result in compare_store(args.out, args.a, args.b, replicates=args.bootstrap, seed=args.seed):
        print(f"A = {result['a']}, B = {result['b']}, guidance {result['guidance']:g}, {result['n_images']} images "
              f"of {result['n_prompts']} prompts, {result['bootstrap']} paired bootstrap replicates:")
        for m in result["metrics"]:
            print(f"  {m['sentence']}")
        print(f"  (written to {write_comparison(args.out, result)})")
    from .report import write_report

    print(f"report: {write_report(args.out)}")


def cmd_report(args) -> None:
    from .report import write_report
    from .store import ResultsStore

    csv = ResultsStore(args.out).export_csv()
    print(f"wrote {write_report(args.out)} and {csv}")


def _common(p, scoring: bool = True) -> None:
    """The scoring options; ``scoring=False`` (compare): --reference only needed to score what is not scored yet."""
    p.add_argument("--out", required=True, help="results folder: results.jsonl, results.csv, samples/, report/")
    p.add_argument("--reference", required=scoring, help="reference images: an MDS folder or an image folder")
    p.add_argument("--inception-weights",
                   help="path to weights-inception-2015-12-05-6726825d.pth (or its folder); FID on Inception features")
    p.add_argument("--scorer", help="a shapes domain scorer (`dwb evaluate train-scorer`): domain FID on its features "
                                    "and attribute accuracy (colour, shape, count, position) instead of Inception")
    p.add_argument("--inception-features", type=int, choices=(64, 192, 768, 2048), default=2048,
                   help="Inception layer: 2048 (pool3, the standard FID) or a smaller, faster one")
    p.add_argument("--prompts", default="reference",
                   help="'reference' (its captions), 'shapes', or a CSV/TSV file such as DrawBench or PartiPrompts")
    p.add_argument("--n-prompts", type=_positive, default=1000, help="first N prompts of the set")
    p.add_argument("--n-per-prompt", type=_positive, default=1, help="images per prompt")
    p.add_argument("--n-reference", type=_positive, default=1000, help="reference images for the statistics")
    p.add_argument("--guidance", type=_guidance, default=(1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0),
                   help="guidance scales (default 1.5,2,3,4,5,6,7,8)")
    p.add_argument("--steps", type=_positive, default=25)
    p.add_argument("--sampler", choices=list(SAMPLERS), metavar="NAME",
                   help=f"one of: {', '.join(SAMPLERS)} (default: the checkpoint's own, DPM++ 2M for training "
                        "checkpoints); it names the samples' folder and the results' 'scheduler' column")
    p.add_argument("--size", type=_positive, help="image side (default: the model's native size)")
    p.add_argument("--batch-size", type=_positive, default=16)
    p.add_argument("--seed", type=int, default=0, help="base of the per-image seeds")
    p.add_argument("--clip", help="CLIP model folder or hub id for CLIP score (default: no CLIP score)")
    p.add_argument("--cmmd", action="store_true",
                   help="also CMMD (Gaussian-kernel MMD on the --clip model's image embeddings, x1000)")
    p.add_argument("--dinov2", help="DINOv2 model folder or hub id already in the Hugging Face cache (facebook/dinov2-large): "
                                    "FD-DINOv2, precision, recall, density and coverage on its features")
    p.add_argument("--bootstrap", type=_replicates, default=200,
                   help="bootstrap replicates for the 95%% intervals (prompts resampled); 0: no intervals")
    p.add_argument("--ema", action="store_true", help="score the EMA weights")
    p.add_argument("--kid-subsets", type=_positive, default=100)
    p.add_argument("--kid-subset-size", type=_positive, default=1000)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="generation precision (default: bf16 on a GPU, fp16 where it has no bf16, fp32 on a CPU)")
    p.add_argument("--allow-fewer-reference", action="store_true", help="use a reference set smaller than --n-reference")
    p.add_argument("--cache", help="reference statistics cache (default OUT/cache)")


def register(sub) -> None:
    ev = sub.add_parser("evaluate", help="FID, KID and CLIP score of checkpoints, guidance sweeps, sample sets")
    ev_sub = ev.add_subparsers(dest="evaluate_command", required=True, metavar="EVALUATE_COMMAND")

    p = ev_sub.add_parser("run", help="score the given checkpoints")
    p.add_argument("checkpoints", nargs="+", help="checkpoints: Composer .pt files (this project's or mosaicml/diffusion's), "
                                                  "diffusers folders, .safetensors/.ckpt single files, hub ids, s3:// URIs")
    _common(p)
    p.set_defaults(func=cmd_run)

    p = ev_sub.add_parser("watch", help="score each new checkpoint of a run as it appears (once, across restarts)")
    p.add_argument("run_dir", help="a training run's folder or s3:// prefix (or its checkpoints/ folder)")
    _common(p)
    p.add_argument("--interval", type=float, default=30.0, help="seconds between polls")
    p.add_argument("--settle", type=float, default=10.0, help="seconds a file must stay unchanged before scoring")
    p.add_argument("--max-polls", type=_positive, help="stop after N polls (default: watch forever)")
    p.add_argument("--retry-unreadable", action="store_true",
                   help="try again the checkpoints recorded as unreadable (a changed file is always tried again)")
    p.set_defaults(func=cmd_watch)

    p = ev_sub.add_parser("compare", help="is B better than A: each metric's difference with a paired interval "
                                           "and p-value (scores A or B first when the store lacks them)")
    p.add_argument("a", help="model label or checkpoint path (scored in --out, or scored now)")
    p.add_argument("b", help="model label or checkpoint path")
    _common(p, scoring=False)
    p.set_defaults(func=cmd_compare)

    p = ev_sub.add_parser("train-scorer", help="train the shapes domain scorer (domain FID, attribute accuracy)")
    p.add_argument("data", help="a shapes dataset folder (`dwb data shapes`): trains on DATA/32, checks on DATA/eval/32")
    p.add_argument("out", help="the scorer file to write (.pt)")
    p.add_argument("--epochs", type=_positive, default=6)
    p.add_argument("--batch-size", type=_positive, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train_scorer)

    p = ev_sub.add_parser("report", help="rebuild results.csv and report/ from the results store")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_report)
