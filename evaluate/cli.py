"""`dwb evaluate run|watch|report`: score checkpoints, watch a run, rebuild the report."""
from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

from models.generation import (DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_STEPS, MAX_ASPECT, SAMPLERS, WEIGHT_CHOICES,
                               aspect_problem)

from .config import (GENERATION_DTYPES, INCEPTION_FEATURES, EvalConfig, guidance_scales, load_eval_config, positive,
                     replicates)

DEFAULT = {f.name: f.default for f in fields(EvalConfig)}  # what a key is when neither file nor flag gives it


def _guidance(value: str) -> tuple[float, ...]:
    try:
        scales = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated guidance scales such as 1.5,3,5,8, got {value!r}") from None
    return _checked(scales, guidance_scales)


def _checked(value, rule):
    problem = rule(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _positive(value: str) -> int:
    return _checked(int(value), positive)


def _replicates(value: str) -> int:
    return _checked(int(value), replicates)


def _aspect(value: str) -> str:
    return _checked(value, aspect_problem)


OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")  # key=value, as `dwb train` takes them


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """(the other arguments, the key=value overrides); an existing path such as ``runs/a=1.pt`` is no override."""
    overrides = [a for a in items if OVERRIDE.match(a) and not Path(a).exists()]
    return [a for a in items if a not in overrides], overrides


class KeyValueParser(argparse.ArgumentParser):
    """Takes key=value overrides wherever they stand: argparse gives positionals only their first run of
    arguments, so ``watch RUN --config F steps=20`` would otherwise refuse ``steps=20``."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if getattr(namespace, "overrides", None) is None:  # a command without overrides
            return namespace, extras
        namespace.overrides = namespace.overrides + [a for a in extras if OVERRIDE.match(a)]
        return namespace, [a for a in extras if not OVERRIDE.match(a)]


def config_from_args(args, scoring: bool = True) -> EvalConfig:
    """The EvalConfig of --config FILE, then the flags given, then key=value overrides (the later wins).

    `run` takes its key=value arguments among the checkpoints: they are moved from ``args.checkpoints`` to
    ``args.overrides`` here. ``scoring=False`` (compare): --reference is needed only to score what the store
    does not hold yet, and `cmd_compare` asks for it then."""
    if hasattr(args, "checkpoints"):
        args.checkpoints, among = split_overrides(args.checkpoints)
        args.overrides = among + args.overrides
    flags = {f.name: getattr(args, f.name) for f in fields(EvalConfig) if getattr(args, f.name, None) is not None}
    return load_eval_config(args.config, flags, args.overrides, base=None if scoring else {"reference": ""})


def _with_interval(r: dict, key: str, fmt: str) -> str:
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    return format(r[key], fmt) + (f" [{lo:{fmt}}, {hi:{fmt}}]" if lo is not None else "")


SUMMARY_FORMATS = (("fid", ".3f"), ("kid_mean", ".5f"), ("clip_score", ".2f"), ("cmmd", ".4f"), ("fd_dinov2", ".3f"),
                   ("pickscore", ".3f"), ("hps", ".4f"), ("imagereward", ".3f"), ("aesthetic", ".3f"))


def _summary(rows: list[dict]) -> None:
    from .attribute_accuracy import HEADLINE_COLUMNS, attr_column
    from .names import display_name

    for r in rows:
        domain = "domain " if str(r.get("extractor", "")).startswith("shapes-scorer") else ""
        scores = [f"{domain if key == 'fid' else ''}{display_name(key)} {_with_interval(r, key, fmt)}"
                  + (f", FD-inf {r['fid_infinity']:.3f}" if key == "fid" and r.get("fid_infinity") is not None else "")
                  for key, fmt in SUMMARY_FORMATS if r.get(key) is not None]
        attrs = ""
        if r.get(attr_column("all", "all")) is not None:
            color, shape, count, position, one_object, every = (r.get(c, float("nan")) for c in HEADLINE_COLUMNS)
            attrs = (f", one group: colour {color:.2f} shape {shape:.2f} count {count:.2f}, position {position:.2f},"
                     f" all right: one object {one_object:.2f}, every prompt {every:.2f}")
        print(f"{r['model']} ({r.get('weights')} weights) cfg {r['guidance']:g}: {', '.join(scores)}{attrs} "
              f"({r['n_images']} images, {r['seconds_total']:.1f} s)")


def cmd_run(args) -> None:
    from models.common import global_rank

    from .run import evaluate_checkpoints

    cfg = config_from_args(args)
    if not args.checkpoints:
        from models.errors import WorkbenchError

        raise WorkbenchError("give at least one checkpoint to score (every argument was a key=value override)")
    rows = evaluate_checkpoints(cfg, args.checkpoints)
    if global_rank() == 0:
        _summary(rows)
        print(f"results in {cfg.out}/results.jsonl (CSV: results.csv), report: {cfg.out}/report/index.html")


def cmd_watch(args) -> None:
    from models.checkpoints import entry_adapter, parse_entry

    from .config import weights_choice
    from .report import write_report
    from .run import Evaluator
    from .watch import Watcher, WatchedEntries

    run, adapters = parse_entry(args.run_dir)  # RUN + FILE@S: the files applied to each checkpoint
    files = tuple(entry_adapter(path, strength) for path, strength in adapters)  # read before anything is scored
    ev = Evaluator(config_from_args(args))
    watched = WatchedEntries(ev.cfg.out, files, args.strengths, args.base, weights_choice(ev.cfg))

    def score(ckpt) -> None:
        for entry in watched.entries(ckpt):
            _summary(ev.score(entry, trained=ckpt))
        ev.store.export_csv()
        write_report(ev.cfg.out)

    def record_unreadable(ckpt, error) -> None:
        for ref in watched.refs(ckpt):
            ev.record_unreadable(ckpt, error, ref=ref)

    Watcher(run, ev.store, score, record_unreadable, settle=args.settle, retry_unreadable=args.retry_unreadable,
            recorded_as=watched.refs).run_forever(interval=args.interval, max_polls=args.max_polls,
                                                  max_wait=args.max_wait)


def cmd_train_scorer(args) -> None:
    from models.shapes import train_scorer

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
    from .verdict import comparison_lines
    from .study_votes import read_study

    cfg = config_from_args(args, scoring=False)
    check_replicates(cfg.bootstrap)
    studies = [read_study(folder) for folder in args.study]  # a missing study or report stops before any work
    missing = [c for c in (args.a, args.b) if not rows_of(ResultsStore(cfg.out).rows(), c)]
    if missing:  # score what the store does not hold yet, with the same prompts and seeds
        from models.errors import WorkbenchError

        from .run import evaluate_checkpoints

        if not cfg.reference:
            raise WorkbenchError(f"{missing[0]} has no scored rows in {cfg.out}/results.jsonl: give --reference and "
                                 f"--inception-weights or --scorer to score it")
        _summary(evaluate_checkpoints(cfg, missing))
    results = compare_store(cfg.out, args.a, args.b, replicates=cfg.bootstrap, seed=cfg.seed, set_flips=args.set_flips)
    for result in results:
        print("\n".join(comparison_lines(result)))
        print(f"  (written to {write_comparison(cfg.out, result)})")
    from .compare_page import write_compare_page

    print(f"page: {write_compare_page(cfg.out, args.a, args.b, results, studies, args.max_pairs)}")
    from .report import write_report

    print(f"report: {write_report(cfg.out)}")


def _strengths(value: str) -> tuple[float, ...]:
    try:
        strengths = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated strengths such as 0.5,0.75,1, got {value!r}") from None
    from models.generation import MAX_STRENGTH

    if not strengths or any(not abs(s) <= MAX_STRENGTH for s in strengths):
        raise argparse.ArgumentTypeError(f"strengths {value}: each from -{MAX_STRENGTH:g} to {MAX_STRENGTH:g}")
    return strengths


def cmd_adapter(args) -> None:
    from .adapter_report import AdapterSetup, adapter_report
    from .names import PREFERENCE_COLUMNS
    from .verdict import interval_shown, verdict_shown

    setup = AdapterSetup(images=args.images, prompts=args.prompts, neutral=args.neutral, out=args.out,
                         dinov2=args.dinov2, clip=args.clip, strengths=args.strengths,
                         preference={k: getattr(args, k) for k in PREFERENCE_COLUMNS if getattr(args, k)},
                         scorer=args.scorer, n_prompts=args.n_prompts, n_per_prompt=args.n_per_prompt,
                         guidance=args.guidance,
                         steps=args.steps, sampler=args.sampler, size=args.size, seed=args.seed,
                         batch_size=args.batch_size, bootstrap=args.bootstrap, device=args.device,
                         progress=not args.no_progress)
    report = adapter_report(args.base, args.adapters, setup)
    for r in report["entries"]:
        print(f"{r['entry']}: " + "; ".join(f"{m['name']} {interval_shown(m)} ({verdict_shown(m)})"
                                           for m in r["metrics"]))
    print(f"recommended: {report['recommendation']['sentence']}")
    print(f"report: {Path(args.out) / 'adapter-report.json'}, page: {Path(args.out) / 'adapter-report.html'}")


def _add_adapter(ev_sub) -> None:
    p = ev_sub.add_parser("adapter", help="did an adapter help: each adapter file x strength against its base on the "
                                           "same prompts and seeds (fidelity, adherence, drift, paired intervals)")
    p.add_argument("base", help="the checkpoint the adapters were trained on (any kind the door opens)")
    p.add_argument("adapters", nargs="+", metavar="ADAPTER", help="adapter files (.safetensors, any layout or kind "
                                                                  "`dwb sample --lora` reads): a run's checkpoints")
    p.add_argument("--images", required=True, metavar="FOLDER", help="the training images (subject fidelity: DINO "
                                                                     "and CLIP image cosine to them)")
    p.add_argument("--prompts", required=True, metavar="SET", help="held-out prompts with the trigger: a CSV/TSV with "
                                                                   "a prompt column, drawbench, parti or shapes")
    p.add_argument("--neutral", required=True, metavar="SET", help="neutral prompts without the trigger (drift from "
                                                                   "the base's own image at the same seed)")
    p.add_argument("--out", required=True, help="folder for the samples, adapter-report.json and .html")
    p.add_argument("--dinov2", required=True, metavar="FOLDER_OR_HUB_ID", help="DINOv2 (DreamBench uses ViT-S/16 "
                                                                               "DINO; facebook/dinov2-small)")
    p.add_argument("--clip", required=True, metavar="FOLDER_OR_HUB_ID", help="CLIP for CLIP-I and the CLIP score")
    p.add_argument("--scorer", metavar="FILE", help="the shapes domain's scorer (`dwb evaluate train-scorer`): "
                                                    "every attribute right on the held-out prompts, as adherence")
    p.add_argument("--strengths", type=_strengths, default=(0.5, 0.75, 1.0), help="comma-separated (default "
                                                                                   "0.5,0.75,1)")
    p.add_argument("--n-prompts", type=_positive, help="use the first N prompts of each set")
    p.add_argument("--n-per-prompt", type=_positive, default=1, help="images per prompt (seeds as `evaluate run`)")
    p.add_argument("--guidance", type=float, default=DEFAULT_GUIDANCE)
    p.add_argument("--steps", type=_positive, default=DEFAULT_STEPS)
    p.add_argument("--sampler", choices=SAMPLERS)
    p.add_argument("--size", type=_positive, help="image side (default: the base's native size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=_positive, default=8)
    p.add_argument("--bootstrap", type=_replicates, default=200, help="replicates (the intervals are t-intervals "
                                                                      "on per-prompt means; p >= 2 / (N + 1))")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
    _preference_flags(p)
    p.set_defaults(func=cmd_adapter)



def cmd_report(args) -> None:
    from .report import write_report
    from .store import ResultsStore

    csv = ResultsStore(args.out).export_csv()
    print(f"wrote {write_report(args.out)} and {csv}")


def _common(p, scoring: bool = True) -> None:
    """The scoring options, each also a config key (its name with underscores); defaults are EvalConfig's.
    ``scoring=False`` (compare): --reference only needed to score what is not scored yet."""
    p.add_argument("--config", metavar="FILE", help="a YAML file of these options (keys: the flags' names with "
                                                    "underscores); flags and key=value arguments win over it")
    p.add_argument("--out", help="results folder: results.jsonl, results.csv, samples/, report/")
    p.add_argument("--reference", help="reference images: an MDS folder or an image folder"
                                       + ("" if scoring else " (needed only to score A or B first)"))
    p.add_argument("--inception-weights",
                   help="path to weights-inception-2015-12-05-6726825d.pth (or its folder); FID on Inception features")
    p.add_argument("--scorer", help="a shapes domain scorer (`dwb evaluate train-scorer`): domain FID on its features "
                                    "and attribute accuracy (colour, shape, count, position) instead of Inception")
    p.add_argument("--inception-features", type=int, choices=INCEPTION_FEATURES,
                   help=f"Inception layer: 2048 (pool3, the standard FID) or a smaller, faster one (default "
                        f"{DEFAULT['inception_features']})")
    p.add_argument("--prompts", help="'reference' (its captions), 'shapes', 'drawbench' or 'parti' (shipped), or a "
                                     f"CSV/TSV file with a prompt column (default {DEFAULT['prompts']})")
    p.add_argument("--n-prompts", type=_positive, help=f"first N prompts of the set (default {DEFAULT['n_prompts']})")
    p.add_argument("--n-per-prompt", type=_positive, help=f"images per prompt (default {DEFAULT['n_per_prompt']})")
    p.add_argument("--n-reference", type=_positive, help=f"reference images for the statistics (default {DEFAULT['n_reference']})")
    p.add_argument("--guidance", type=_guidance,
                   help=f"guidance scales (default the sweep {','.join(f'{g:g}' for g in DEFAULT['guidance'])}, which "
                        f"holds {DEFAULT_GUIDANCE:g}, what dwb sample and the app generate at, and gains the "
                        "checkpoint's recommended scale where it is not among them)")
    p.add_argument("--steps", type=_positive,
                   help=f"sampler steps (default: the checkpoint's recommended steps, else {DEFAULT_STEPS})")
    p.add_argument("--sampler", choices=list(SAMPLERS), metavar="NAME",
                   help=f"one of: {', '.join(SAMPLERS)} (default: the checkpoint's recommended sampler, else "
                        f"{DEFAULT_SAMPLER}); a sampler named here also names the samples' folder; the results' "
                        "'sampler' column records it")
    p.add_argument("--size", type=_positive, help="image side (default: the checkpoint's recommended size, else its "
                                                  "native size, the resolution it was trained at where it records one)")
    p.add_argument("--aspect", type=_aspect, metavar="W:H",
                   help=f"draw every prompt at this aspect ratio (16:9, 2:1, 1:2; up to {MAX_ASPECT:g}:1): the aspect "
                        "bucket nearest it on a budget of --size x --size pixels, on the family's step (default: "
                        "square)")
    p.add_argument("--aspect-column", metavar="NAME",
                   help="draw each prompt at its own aspect ratio, W:H from this column of the --prompts CSV/TSV file "
                        "(an empty cell: --aspect, else square)")
    p.add_argument("--parts", metavar="FOLDER_OR_HUB_ID",
                   help="where the single files' other parts come from, as in dwb sample: a diffusers folder of the "
                        "same model or a hub id in the local cache (default: NAME.config/ beside NAME.safetensors)")
    p.add_argument("--batch-size", type=_positive, help=f"generation and feature batch (default {DEFAULT['batch_size']})")
    p.add_argument("--seed", type=int, help=f"base of the per-image seeds (default {DEFAULT['seed']})")
    p.add_argument("--clip", help="CLIP model folder or hub id for CLIP score (default: no CLIP score)")
    p.add_argument("--cmmd", action="store_true", default=None,
                   help="also CMMD (Gaussian-kernel MMD on the --clip model's image embeddings, x1000)")
    p.add_argument("--dinov2", help="DINOv2 model folder or hub id already in the Hugging Face cache (facebook/dinov2-large): "
                                    "FD-DINOv2, precision, recall, density and coverage on its features")
    _preference_flags(p)
    p.add_argument("--bootstrap", type=_replicates,
                   help=f"bootstrap replicates for the 95%% intervals (prompts resampled; default {DEFAULT['bootstrap']}); "
                        "0: no intervals")
    p.add_argument("--weights", choices=WEIGHT_CHOICES,
                   help=f"a Composer checkpoint's EMA or raw weights (default {DEFAULT['weights']}: EMA where it holds "
                        "them); each row's 'weights' says which were scored: ema, raw, or stored (the one set of "
                        "the other kinds)")
    p.add_argument("--ema", action="store_true", default=None, help="the same as --weights ema")
    p.add_argument("--kid-subsets", type=_positive, help=f"KID subsets (default {DEFAULT['kid_subsets']})")
    p.add_argument("--kid-subset-size", type=_positive, help=f"images per KID subset (default {DEFAULT['kid_subset_size']})")
    p.add_argument("--device", help=f"auto, cpu or cuda (default {DEFAULT['device']})")
    p.add_argument("--dtype", choices=GENERATION_DTYPES,
                   help=f"generation precision (default {DEFAULT['dtype']}: bf16 on a GPU, fp16 where it has no bf16, fp32 "
                        "on a CPU)")
    p.add_argument("--allow-fewer-reference", action="store_true", default=None,
                   help="use a reference set smaller than --n-reference")
    p.add_argument("--cache", help="reference statistics cache (default OUT/cache)")


def _preference_flags(p) -> None:
    """--pickscore, --hps, --imagereward, --aesthetic: alone, the authors' published weights (from the Hugging
    Face cache, or the hub when online); with a value, that file, folder or hub id."""
    from .scorers.weights import PREFERENCE_WEIGHTS

    for flag, what in (("pickscore", "PickScore (a CLIP-H folder or hub id)"),
                       ("hps", "HPSv2.1 (HPS_v2.1_compressed.pt, its folder or hub id)"),
                       ("imagereward", "ImageReward (ImageReward.pt and med_config.json: their folder or hub id)"),
                       ("aesthetic", "LAION aesthetic score (the predictor's head file, on --clip's image embeddings "
                                     "when ViT-L/14, else OpenAI's)")):
        default = PREFERENCE_WEIGHTS[flag]
        p.add_argument(f"--{flag}", nargs="?", const=default, metavar="WEIGHTS",
                       help=f"per-image {what}, with its interval; alone: {default}")


def _set_help(parser, dest: str, text: str) -> None:
    """One subcommand's own help for an option that ``_common`` adds to several."""
    next(a for a in parser._actions if a.dest == dest).help = text.replace("%", "%%")


def register(sub) -> None:
    ev = sub.add_parser("evaluate", help="FID, KID and CLIP score of checkpoints, guidance sweeps, sample sets")
    ev_sub = ev.add_subparsers(dest="evaluate_command", required=True, metavar="EVALUATE_COMMAND",
                               parser_class=KeyValueParser)

    p = ev_sub.add_parser("run", help="score the given checkpoints")
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT_OR_KEY=VALUE",
                   help="checkpoints: Composer .pt files (this project's or mosaicml/diffusion's), diffusers folders, "
                        ".safetensors/.ckpt single files, hub ids, s3:// URIs; and key=value config overrides")
    _common(p)
    p.set_defaults(func=cmd_run, overrides=[])

    p = ev_sub.add_parser("watch", help="score each new checkpoint of a run as it appears (once, across restarts)")
    p.add_argument("run_dir", metavar="RUN", help="a training run's folder or s3:// prefix (or its checkpoints/ folder); "
                                                  "\"RUN + FILE@S\": each checkpoint with adapter files applied, as "
                                                  "`run` takes \"BASE + FILE@S\"; an adapter run's checkpoints are "
                                                  "scored on the base they name, the adapter at each --strengths")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. steps=20 guidance=[3,5]")
    _common(p)
    p.add_argument("--interval", type=float, default=30.0, help="seconds between polls")
    p.add_argument("--settle", type=float, default=10.0, help="seconds a file must stay unchanged before scoring")
    p.add_argument("--max-polls", type=_positive, help="stop after N polls (default: watch forever)")
    p.add_argument("--max-wait", type=float, metavar="SECONDS",
                   help="how long to wait for a run folder that does not exist yet (default: no limit)")
    p.add_argument("--retry-unreadable", action="store_true",
                   help="try again the checkpoints recorded as unreadable (a changed file is always tried again)")
    p.add_argument("--strengths", type=_strengths, default=(1.0,),
                   help="an adapter run's checkpoints: the strengths each adapter is scored at, comma-separated "
                        "(default 1)")
    p.add_argument("--base", metavar="CHECKPOINT",
                   help="an adapter run's base, where its spec's model.init_from does not lead to it from here "
                        "(checked against the content hash the spec names)")
    p.set_defaults(func=cmd_watch)

    p = ev_sub.add_parser("compare", help="is B better than A: each metric's difference with a paired interval "
                                           "and p-value (scores A or B first when the store lacks them)")
    p.add_argument("a", help="model label or checkpoint path (scored in --out, or scored now)")
    p.add_argument("b", help="model label or checkpoint path")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. bootstrap=1000")
    _common(p, scoring=False)
    _set_help(p, "bootstrap", f"paired bootstrap replicates (prompts resampled; default {DEFAULT['bootstrap']}, at "
                              f"least 40); a family of several metrics gets 80 per metric where that is more, so that "
                              f"Holm's adjustment within it can find a difference (1,200 for the 14 attribute "
                              f"accuracies); the output gives each family's count")
    p.add_argument("--study", action="append", default=[], metavar="DIR",
                   help="a `dwb human-eval` study of A's and B's images, reported (`dwb human-eval report DIR`): its "
                        "raters' votes beside each pair on the comparison page; repeatable")
    p.add_argument("--max-pairs", type=_positive, metavar="N",
                   help="image pairs per guidance scale on the comparison page, those that differ most (default 48)")
    p.add_argument("--set-flips", action="store_true",
                   help="also search how many prompts would flip each set metric's verdict (FID, KID, CMMD, "
                        "FD-DINOv2): a greedy upper bound that costs some ten bootstraps of the metric, about 10 "
                        "minutes per metric at 1,000 images on 2 cores (per-image metrics' counts are always given)")
    p.set_defaults(func=cmd_compare)

    _add_adapter(ev_sub)

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
