"""The training side of `dwb`: data, prepare, train, export, sample, runs, plan."""
from __future__ import annotations

import argparse

from .generation import (DEFAULT_GUIDANCE, DEFAULT_REFINER_SWITCH, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS,
                         MAX_ASPECT, MAX_GUIDANCE, MAX_SEED, MAX_SIZE, MAX_STEPS, MIN_SIZE, RECOMMENDED_KEYS, SAMPLERS,
                         SIZE_STEP, WEIGHT_CHOICES, parse_aspect, parse_size)


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return n


def _part(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/N such as 0/4, got {value!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"expected i/N with 0 <= i < N, got {value!r}")
    return i, n


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return x


def _number(x: float) -> str:
    """30.0 as "30", 4294967295 as itself (not 4.29497e+09)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _between(lo, hi, kind=int, step: int | None = None):
    """An argparse type: a ``kind`` number in [lo, hi] (a multiple of ``step``), the app's limits on one image."""
    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {value!r}") from None
        if not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not between {_number(lo)} and {_number(hi)}")
        if step and x % step:
            raise argparse.ArgumentTypeError(f"{value} is not a multiple of {step}")
        return x
    return parse


def _argument(parse):
    """An argparse type from a parser that raises a one-line WorkbenchError."""
    def parsed(value: str):
        from .errors import WorkbenchError

        try:
            return parse(value)
        except WorkbenchError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parsed


def _number_from(low: float, high: float, ends: bool, meaning: str = ""):
    """An argparse type: a number from ``low`` to ``high``, the ends included or not (``meaning`` says what it is)."""
    def parsed(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not (low <= x <= high if ends else low < x < high):
            raise argparse.ArgumentTypeError(f"{value} is not {'from' if ends else 'between'} {low:g} "
                                             f"{'to' if ends else 'and'} {high:g}{meaning}")
        return x
    return parsed


_share = _number_from(0, 1, ends=True)  # a share of the samples
_fraction = _number_from(0, 1, ends=False, meaning=" (the fraction of the steps the base takes)")  # the refiner's switch


def _sizes(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes such as 256,512, got {value!r}") from None
    if any(s <= 0 or s % 8 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive multiples of 8, got {value!r}")
    return sizes


def cmd_shapes(args) -> None:
    from .shapes import write_shapes_dataset

    counts = write_shapes_dataset(args.out, args.n, args.seed, sizes=args.sizes, n_eval=args.n_eval, wide=args.wide)
    buckets = ", ".join(f"{args.out}/{s}" for s in args.sizes)
    print(f"wrote {counts.get('train', 0)} training samples per bucket ({buckets}) and "
          f"{counts.get('eval', 0)} held-out samples ({args.out}/eval/{max(args.sizes)})"
          + (f", their prompts and aspects in {args.out}/eval/prompts.csv" if args.wide and counts.get("eval") else ""))


def cmd_convert(args) -> None:
    from .data import convert_to_mds

    summary = convert_to_mds(args.src, args.out, buckets=args.buckets, image_format=args.image_format,
                      image_column=args.image_column, caption_column=args.caption_column,
                      min_aesthetic=args.min_aesthetic, aesthetic_column=args.aesthetic_column,
                      language_column=args.language_column, languages=args.languages.split(",") if args.languages else None,
                      max_punsafe=args.max_punsafe, max_watermark=args.max_watermark,
                      split=args.split, limit=args.limit, workers=args.workers, part=args.part,
                      aspect_buckets=args.aspect_buckets, bucket_step=args.bucket_step, max_aspect=args.max_aspect,
                      **({"max_megapixels": args.max_megapixels} if args.max_megapixels else {}),
                      **({"max_row_group_bytes": args.max_row_group_mib * 2**20} if args.max_row_group_mib else {}))
    kept = f" ({summary.units_kept} units kept from an earlier run)" if summary.units_kept else ""
    if args.part:
        i, n = args.part
        print(f"part {i}/{n}: {summary.line()}{kept}; once all {n} parts are done: dwb data join {args.out}")
    else:
        print(summary.line() + kept)


def cmd_join(args) -> None:
    from .data import join_parts

    print(join_parts(args.out).line())


def cmd_precompute(args) -> None:
    from .data import precompute_latents

    vae = args.vae or args.pretrained
    text_encoder = args.text_encoder or args.pretrained
    if not vae or not text_encoder:
        from .errors import WorkbenchError

        raise WorkbenchError("give --pretrained ROOT (a diffusers folder or hub id), or both --vae and --text-encoder")
    summaries = precompute_latents(args.src, args.out, vae_ref=vae, text_encoder_ref=text_encoder,
                           tokenizer_ref=args.tokenizer or (args.pretrained if not args.text_encoder else None),
                           resolutions=args.resolution, batch_size=args.batch_size, dtype=args.dtype,
                           device=args.device, chunk_size=args.chunk_size, cache=args.cache)
    from composer.utils import dist

    if dist.get_global_rank() == 0:
        for s in summaries:
            how = "already complete" if s["already_done"] else (
                f"{s['encoded']} encoded here" + (f", {s['resumed_chunks']} chunks kept from an earlier run" if s["resumed_chunks"] else ""))
            print(f"{s['out']}: {s['samples']} samples at {s['resolution']} px ({how}, {s['seconds']:.1f} s); "
                  f"train with data.path={s['out']} data.precomputed=true")


def cmd_prepare(args) -> None:
    from .shapes import prepare_tiny

    report = prepare_tiny(args.data, args.out, vae_steps=args.vae_steps, seed=args.seed)
    print(f"tiny components in {args.out}: tokenizer of {report['vocab_size']} tokens, text encoder, "
          f"VAE ({report['vae_steps']} steps, held-out PSNR {report['vae_holdout_psnr_db']:.1f} dB)")


def cmd_train(args) -> None:
    from .config import load_config
    from .trainer import train

    cfg = load_config(args.config, args.overrides)
    folder = train(cfg)
    print(f"checkpoints in {folder}")


def cmd_export(args) -> None:
    from .checkpoints import absent_parts, config_folder, export_checkpoint, find_checkpoint, weights_of
    from .generation import parse_recommended

    settings = {k: v for k, v in (("prediction_type", args.prediction_type), ("latent_scale", args.latent_scale))
                if v is not None}
    recommended = parse_recommended(args.settings) if args.settings else {}
    chosen = weights_of(find_checkpoint(args.checkpoint), "ema" if args.ema else args.weights)
    out, fmt = export_checkpoint(args.checkpoint, args.out, fmt=args.format, ema=chosen == "ema", half=args.half,
                                 settings=settings, results=args.results or [], studies=args.study or [],
                                 recommended=recommended)
    named = {"ema": "EMA", "raw": "raw", "stored": "the"}[chosen]
    weights = f"{named} weights ({'float16' if args.half else 'float32'})"
    if fmt == "single-file":
        config, original = config_folder(out), out.with_suffix(".yaml")
        beside = f" and its original config {original}" if original.exists() else ""  # SD 1/2's alone
        reader = f"from_single_file('{out}'" + (f", config='{config}'" if config.exists() else "") + ")"
        print(f"exported {weights} of {args.checkpoint} to {out}{beside} (AUTOMATIC1111, ComfyUI, Forge; "
              f"diffusers' {reader})")
    else:
        absent = "".join(f", {name}=None" for name in absent_parts(out) if name.startswith(("text_encoder", "tokenizer")))
        print(f"exported {weights} of {args.checkpoint} to {out} with its model card {out / 'README.md'} "
              f"(diffusers.DiffusionPipeline.from_pretrained('{out}'{absent}); the card says how to call it)")


def _latent_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a positive number, not {text!r} (SD 2.x: 0.18215)")
    return value


def first_seed(seed: int, n: int) -> int:
    """``seed``, or a random one for -1, such that the ``n`` seeds from it stay 32-bit, as in the app."""
    import random

    from .errors import WorkbenchError

    if seed == -1:
        return random.randint(0, MAX_SEED - n + 1)
    if seed + n - 1 > MAX_SEED:
        raise WorkbenchError(f"--seed {seed} and --seeds {n} go past the last seed, {MAX_SEED}")
    return seed


def cmd_sample(args) -> None:
    from pathlib import Path

    from .checkpoints import (content_hash, describe, find_checkpoint, load_pipeline, native_size_of,
                              recommended_settings, weights_of)
    from .errors import WorkbenchError
    from .families import family_or_ours
    from .generation import (DEMO_PROMPTS, Refiner, Settings, drawn_native_side, image_format, starting_settings,
                             write_grid)

    seed = first_seed(args.seed, args.seeds)
    image_format(args.out)  # before the checkpoint is opened: an output that would carry no parameters
    if isinstance(args.size, tuple) and args.aspect:
        raise WorkbenchError("give --size WIDTHxHEIGHT or --aspect W:H (with --size SIDE as its budget), not both")
    ckpt = find_checkpoint(args.checkpoint, parts=args.parts)
    weights = weights_of(ckpt, "ema" if args.ema else args.weights)
    given = {"guidance": args.guidance, "steps": args.steps, "sampler": args.sampler, "size": args.size}
    chosen, recommended = starting_settings(given, recommended_settings(ckpt))
    info = describe(ckpt)
    family = family_or_ours(info.family)
    # before the weights are read: a size the family cannot draw is one line (the native size, where only the
    # pipeline knows it, is the model's own)
    size = sample_size(chosen["size"] or drawn_native_side(info.resolution, ckpt.label), args.aspect, family,
                       info.resolution, given=args.size)
    if recommended:
        print(recommended)
    pipe = load_pipeline(ckpt, ema=weights == "ema")
    refiner = None
    if args.refiner:
        ref = find_checkpoint(args.refiner)
        refiner = Refiner(load_pipeline(ref, refiner=True), ref.label, content_hash(ref), args.refiner_switch)
    width, height = size or sample_size(native_size_of(ckpt, pipe), args.aspect, family, info.resolution)
    settings = Settings(steps=chosen["steps"], guidance=chosen["guidance"], width=width, height=height,
                        sampler=chosen["sampler"], negative_prompt=args.negative_prompt, refiner=refiner)
    out = Path(args.out)
    images_to = (out.with_suffix("") if out.suffix else out.with_name(f"{out.name}-images")) if args.per_image else None
    out = write_grid(pipe, out, args.prompt or DEMO_PROMPTS, seeds=range(seed, seed + args.seeds),
                     title=f"{ckpt.label} ({content_hash(ckpt)}) {weights} weights", settings=settings,
                     checkpoint=ckpt.label, checkpoint_hash=content_hash(ckpt), weights=weights, images_to=images_to)
    print(f"wrote {out}: {weights} weights, guidance {settings.guidance:g}, {settings.steps} steps, "
          f"{settings.sampler}, {width if width == height else f'{width}x{height}'} px, seeds {seed} to {seed + args.seeds - 1}"
          + (f"; refined by {refiner.name} from {refiner.switch:g} of the steps" if refiner else "")
          + (f"; each image in {images_to}" if images_to else ""))


def sample_size(size, aspect, family, resolution: int | None, given=None) -> tuple[int, int] | None:
    """(width, height) `dwb sample` draws at: ``size`` as WIDTHxHEIGHT, a square of its side, or with ``aspect`` the
    bucket of that aspect on the budget side x side (``train.data.aspect_bucket``, on the family's size step, so
    the family draws it); None where ``size`` is (the native side, known once the pipeline is open). A size given on
    the command line (``given``) and a bucket are checked against the family's step and sides (one line)."""
    from .data import aspect_bucket
    from .generation import check_drawable

    if size is None:
        return None
    if isinstance(size, tuple):
        check_drawable(family, size, "--size", resolution)
        return size
    if given is not None:
        check_drawable(family, (size, size), "--size", resolution)
    if aspect is None:
        return size, size
    check_drawable(family, (size, size), "--aspect's budget", resolution, within_range=False)
    bucket = aspect_bucket(aspect, size, family.size_step())
    check_drawable(family, bucket, f"the {aspect[0]:g}:{aspect[1]:g} bucket of {size} px", resolution)
    return bucket


def cmd_runs_plot(args) -> None:
    from .callbacks import plot_runs

    print(f"wrote {plot_runs(args.runs, args.out)}")


def cmd_plan(args) -> None:
    from .callbacks import measured_from_run, plan_rows, schedule_samples, table
    from .errors import WorkbenchError

    measured = dict(args.measured or [])
    for run in args.run or []:
        gpus, rate = measured_from_run(run)
        measured[gpus] = rate
    if args.samples is None and not args.config:
        raise WorkbenchError("give --samples N or the schedule's configs (--config phase1.yaml --config phase2.yaml)")
    if args.samples is not None:
        samples = int(args.samples)
    else:
        from .config import load_config

        samples = schedule_samples([load_config(c) for c in args.config])
    rows = plan_rows(measured, samples, args.gpus, args.scaling_efficiency, args.usd_per_gpu_hour)
    print(f"{samples / 1e9:.4g}B samples; measured rows from the throughput given, the others extrapolated "
          f"keeping {args.scaling_efficiency:g} of linear scaling per doubling of GPUs")
    print(table(rows, args.scaling_efficiency))


def _measured(value: str) -> tuple[int, float]:
    try:
        gpus, rate = value.split(":")
        pair = int(gpus), float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPUS:IMAGES_PER_SEC such as 8:128.2, got {value!r}") from None
    if pair[0] <= 0 or pair[1] <= 0:
        raise argparse.ArgumentTypeError(f"GPUs and images/s must be positive, got {value!r}")
    return pair


def _counts(value: str) -> list[int]:
    try:
        counts = [int(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU counts such as 8,64,128, got {value!r}") from None
    if any(c <= 0 for c in counts):
        raise argparse.ArgumentTypeError(f"GPU counts must be positive, got {value!r}")
    return counts


def _efficiency(value: str) -> float:
    x = _positive_float(value)
    if x > 1:
        raise argparse.ArgumentTypeError(f"a scaling efficiency is at most 1, got {value}")
    return x


def register(sub) -> None:
    """`dwb data ...`, `prepare`, `train`, `export`, `sample`, `runs plot`, `plan`."""
    register_data(sub)
    register_model(sub)
    register_runs(sub)


def register_runs(sub) -> None:
    runs = sub.add_parser("runs", help="look at training runs: curves across phases and restarts")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True, metavar="RUNS_COMMAND")
    p = runs_sub.add_parser("plot", help="training loss, validation loss, lr and throughput against samples seen")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders in order (phase 1, phase 2 ...), "
                   "each with the logs/ `dwb train` writes")
    p.add_argument("--out", default="curves.png")
    p.set_defaults(func=cmd_runs_plot)

    p = sub.add_parser("plan", help="measured throughput -> GPUs, images/s, days, GPU-hours and cost of a schedule")
    p.add_argument("--measured", action="append", type=_measured, metavar="GPUS:IMAGES_PER_SEC",
                   help="a measured row, e.g. 8:128.2 (repeatable; bench/train_throughput.py measures one GPU)")
    p.add_argument("--run", action="append", metavar="RUN", help="a run folder whose logs give a measured row")
    p.add_argument("--config", action="append", help="the schedule's phases (samples = max_duration x batch), repeatable")
    p.add_argument("--samples", type=_positive_float, help="the schedule's samples instead of --config")
    p.add_argument("--gpus", type=_counts, default=[8, 16, 32, 64, 128, 256], help="rows (default 8,16,...,256)")
    p.add_argument("--scaling-efficiency", type=_efficiency, default=0.95,
                   help="share of linear speed-up kept per doubling of GPUs, for extrapolated rows (default 0.95)")
    p.add_argument("--usd-per-gpu-hour", type=_positive_float, help="price of one GPU-hour (cost column)")
    p.set_defaults(func=cmd_plan)


def register_data(sub) -> None:
    data = sub.add_parser("data", help="make or convert training data (MDS)")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")

    p = data_sub.add_parser("shapes", help="generate the synthetic shapes dataset")
    p.add_argument("out")
    p.add_argument("--n", type=_positive, default=16000, help="training samples per bucket")
    p.add_argument("--n-eval", type=int, default=1000, help="held-out samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", type=_sizes, default=(16, 32), help="resolution buckets (default 16,32)")
    p.add_argument("--wide", type=_share, default=0.0, metavar="SHARE",
                   help="share of scenes in a wide (5:3) or tall (3:5) frame, converted into aspect-ratio buckets "
                        "(default 0: squares only)")
    p.set_defaults(func=cmd_shapes)

    p = data_sub.add_parser("convert", help="WebDataset/img2dataset shards, Parquet, image folders or HF datasets "
                                            "-> MDS resolution buckets")
    p.add_argument("src", nargs="+", help="folders, files, s3:// prefixes or brace patterns (shards/{00000..00099}.tar)")
    p.add_argument("out")
    p.add_argument("--buckets", type=_sizes, default=(256, 512),
                   help="minimum-side buckets, or with --aspect-buckets pixel budgets (side x side, at most 4096; "
                        "256 aspect buckets in all) (default 256,512)")
    p.add_argument("--aspect-buckets", action="store_true",
                   help="store each image in the aspect-ratio bucket nearest its own (about side x side pixels), "
                        "covered and centre-cropped, with its original size, crop and bucket")
    p.add_argument("--bucket-step", type=_positive,
                   help="aspect buckets' sides are multiples of this (a multiple of 8; default 64 from 512 up, 32 below)")
    p.add_argument("--max-aspect", type=_positive_float,
                   help="widest aspect bucket, as width:height (default 2, at most 4: SDXL's widest buckets)")
    p.add_argument("--image-format", choices=("jpeg", "png"), default="jpeg")
    p.add_argument("--image-column")
    p.add_argument("--caption-column")
    p.add_argument("--min-aesthetic", type=float, help="keep rows whose aesthetic score is at least this")
    p.add_argument("--aesthetic-column")
    p.add_argument("--language-column")
    p.add_argument("--languages", help="comma-separated language codes to keep, e.g. en")
    p.add_argument("--max-punsafe", type=float, help="keep rows whose punsafe (probability of unsafe) is at most this")
    p.add_argument("--max-watermark", type=float, help="keep rows whose pwatermark is at most this")
    p.add_argument("--workers", type=_positive, help="processes converting at once (default: every core)")
    p.add_argument("--part", type=_part, help="convert only part i of N (i from 0), on one of N machines; "
                                              "then `dwb data join OUT`")
    p.add_argument("--split", default="train")
    p.add_argument("--limit", type=_positive)
    p.add_argument("--max-megapixels", type=_positive_float,
                   help="skip and count images with more pixels to decode (JPEGs at their reduced draft size); "
                        "converting one takes about 8 bytes a pixel (default 64: today's camera photos)")
    p.add_argument("--max-row-group-mib", type=_positive,
                   help="skip and count Parquet row groups whose columns hold more, uncompressed (pyarrow reads a "
                        "group's columns whole; default 1024: img2dataset writes about 30, the hub about 100)")
    p.set_defaults(func=cmd_convert)

    p = data_sub.add_parser("join", help="merge the parts of a `dwb data convert --part i/N` run into one dataset")
    p.add_argument("out", help="the OUT every part wrote into (or each part's OUT copied into one)")
    p.set_defaults(func=cmd_join)

    p = data_sub.add_parser("precompute", help="encode an MDS dataset once: VAE latents and text states per bucket")
    p.add_argument("src", help="an MDS folder of resolution buckets (OUT/256, OUT/512), one MDS dataset, or s3://...")
    p.add_argument("out")
    p.add_argument("--pretrained", help="diffusers-layout folder or hub id with vae/, text_encoder/, tokenizer/")
    p.add_argument("--vae", help="the VAE's folder (or a diffusers root); overrides --pretrained")
    p.add_argument("--text-encoder", help="the text encoder's folder (or a diffusers root); overrides --pretrained")
    p.add_argument("--tokenizer", help="default: next to the text encoder")
    p.add_argument("--resolution", type=int, action="append", help="bucket(s) to encode (default: all); "
                   "required for a single dataset")
    p.add_argument("--batch-size", type=_positive, default=32)
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--chunk-size", type=_positive, default=2048, help="samples per resumable unit of work")
    p.add_argument("--cache", help="local cache folder for a remote SRC")
    p.set_defaults(func=cmd_precompute)


def register_model(sub) -> None:
    p = sub.add_parser("prepare", help="build the tiny architecture's tokenizer, text encoder and VAE from data")
    p.add_argument("data", help="shapes dataset folder (its 32 px bucket is used)")
    p.add_argument("out")
    p.add_argument("--vae-steps", type=_positive, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="run one training phase with Composer")
    p.add_argument("config", help="YAML config, e.g. configs/tiny-phase1.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("export", help="any checkpoint -> diffusers folder with a model card, or one "
                                      "original-layout OUT.safetensors (AUTOMATIC1111, ComfyUI, Forge)")
    p.add_argument("checkpoint")
    p.add_argument("out", help="a folder (diffusers), or NAME.safetensors (one file in the original SD layout, "
                               "NAME.yaml and NAME.config/ beside it)")
    p.add_argument("--format", choices=("diffusers", "single-file"), help="default: from OUT's suffix")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--weights", choices=WEIGHT_CHOICES, default=DEFAULT_WEIGHTS,
                         help="a Composer checkpoint's EMA or raw weights (default auto: EMA where it holds them, as "
                              "dwb sample, the app and dwb evaluate open it)")
    weights.add_argument("--ema", action="store_true", help="the same as --weights ema")
    p.add_argument("--half", action="store_true", help="float16 weights (half the size); default float32")
    p.add_argument("--prediction-type", choices=("epsilon", "v_prediction"),
                   help="for a Composer checkpoint that does not record it (mosaicml/diffusion's)")
    p.add_argument("--latent-scale", type=_latent_scale, metavar="SCALE",
                   help="the VAE latent scale, for a Composer checkpoint that does not record it (SD 2.x: 0.18215; "
                        "mosaicml/diffusion's latent_std is its inverse)")
    p.add_argument("--results", action="append", metavar="FOLDER",
                   help="an evaluate results store whose scores of this checkpoint go into the model card; repeatable")
    p.add_argument("--study", action="append", metavar="FOLDER",
                   help="a human-eval study whose win rates of this checkpoint go into the model card; repeatable")
    p.add_argument("--settings", metavar="KEY=VALUE,...",
                   help="the generation settings the export recommends, over the checkpoint's own: "
                        f"{', '.join(RECOMMENDED_KEYS)} (e.g. guidance=3,steps=20,sampler=DPM++ 2M); dwb sample, "
                        "the app and dwb evaluate start from them where no value is given")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("sample", help="a grid of prompts x seeds from any checkpoint, with its parameters (OUT.png, "
                                      ".jpg or .webp)")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--parts", metavar="FOLDER_OR_HUB_ID",
                   help="where a single file's other parts (text encoders, tokenizers, VAE, scheduler, configs) come "
                        "from: a diffusers folder of the same model or a hub id in the local cache (default: "
                        "NAME.config/ beside NAME.safetensors)")
    p.add_argument("--prompt", action="append", help="repeatable; default: the demo prompts")
    p.add_argument("--negative-prompt", default="", help="what to steer away from (default: none)")
    p.add_argument("--seed", type=_between(-1, MAX_SEED), default=0,
                   help="the first column's seed; column j uses seed + j, as image j of a batch in the app (default 0; "
                        "-1: a random one, printed and recorded)")
    p.add_argument("--seeds", type=_positive, default=4, help="columns, seeds --seed to --seed + N - 1 (default 4)")
    p.add_argument("--steps", type=_between(1, MAX_STEPS),
                   help=f"sampler steps, 1 to {MAX_STEPS} (default: the checkpoint's recommended, else {DEFAULT_STEPS})")
    p.add_argument("--guidance", type=_between(0, MAX_GUIDANCE, float),
                   help=f"classifier-free guidance scale, 0 to {MAX_GUIDANCE:g} (default: the checkpoint's "
                        f"recommended, else {DEFAULT_GUIDANCE:g})")
    p.add_argument("--size", type=_argument(parse_size), metavar="SIDE|WIDTHxHEIGHT",
                   help=f"image side (a square) or WIDTHxHEIGHT (768x512), each side {MIN_SIZE} to {MAX_SIZE}, a "
                        f"multiple of {SIZE_STEP} and of the family's step (16 for SD3 and Flux.1), within the sides "
                        "its family draws at the checkpoint's resolution (default: the checkpoint's recommended size, "
                        "else its native size, the resolution it was trained at where it records one)")
    p.add_argument("--aspect", type=_argument(parse_aspect), metavar="W:H",
                   help=f"draw at this aspect ratio (16:9, 2:1, 1:2; up to {MAX_ASPECT:g}:1): the aspect bucket nearest "
                        "it on a budget of --size x --size pixels (default: the native size), as `dwb data convert "
                        "--aspect-buckets` makes them, on the family's step")
    p.add_argument("--sampler", choices=list(SAMPLERS), metavar="NAME",
                   help=f"one of: {', '.join(SAMPLERS)} (default: the checkpoint's recommended, else {DEFAULT_SAMPLER})")
    p.add_argument("--refiner", metavar="REF",
                   help="a second stage that finishes the image: SDXL's refiner (a diffusers folder or hub id) after an "
                        "SDXL base, which stops at --refiner-switch and hands it its latents")
    p.add_argument("--refiner-switch", type=_fraction, default=DEFAULT_REFINER_SWITCH, metavar="F",
                   help=f"the fraction of the steps the base takes before the refiner (default {DEFAULT_REFINER_SWITCH:g})")
    p.add_argument("--per-image", action="store_true",
                   help="also each image as its own PNG, in a folder named after OUT (OUT.png: OUT/00000-SEED.png, "
                        "...), each with its parameters; the grid's are its first image's")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--weights", choices=WEIGHT_CHOICES, default=DEFAULT_WEIGHTS,
                         help="a Composer checkpoint's EMA or raw weights (default auto: EMA where it holds them)")
    weights.add_argument("--ema", action="store_true", help="the same as --weights ema")
    p.set_defaults(func=cmd_sample)
