"""The training side of `dwb`: data, prepare, train, runs, plan."""
from __future__ import annotations

import argparse

from models.common import part_of, positive, positive_number, share, size_list


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


def cmd_dreambooth(args) -> None:
    from .data import ClassPrompt, write_dreambooth
    from models.errors import WorkbenchError

    given = [k for k in ("base", "class_images") if getattr(args, k) is not None]
    if args.class_prompt is None and given:
        raise WorkbenchError(f"--{given[0].replace('_', '-')} is for prior preservation, which --class-prompt turns on")
    prior = None
    if args.class_prompt is not None:
        if args.base is None or args.class_images is None:
            raise WorkbenchError("prior preservation draws class images with the base model: give --base (the model "
                                 "you fine-tune) and --class-images N beside --class-prompt")
        prior = ClassPrompt(args.base, args.class_prompt, args.class_images, max(args.sizes), seed=args.class_seed,
                            steps=args.class_steps, guidance=args.class_guidance, sampler=args.class_sampler,
                            text_tokens=args.class_text_tokens)
    summary = write_dreambooth(args.folder, args.out, sizes=args.sizes, template=args.template,
                               class_word=args.class_word, repeats=args.repeats, masks=args.masks,
                               alpha_mask=args.alpha_mask,
                               hold_out=args.hold_out, validation=args.validation, prior=prior,
                               class_cache=args.class_cache, device=args.device, image_format=args.image_format,
                               **({"max_megapixels": args.max_megapixels} if args.max_megapixels else {}))
    side = max(args.sizes)
    print(f"{summary.line()}; train with data.path={args.out}/{side} data.resolution={side}"
          + (f" validation.path={args.out}/eval/{side}" if summary.held_out else ""))


def run_encoder(config: str, overrides: list[str]) -> tuple[object, dict]:
    """The run's model with its denoiser on the meta device and its frozen parts in float32 (``frozen_model``): what
    its training encodes, for `dwb data precompute --config`; and where each frozen part comes from."""
    from dataclasses import replace

    from .config import load_config
    from .recipes import frozen_model

    cfg = load_config(config, overrides)
    model = frozen_model(replace(cfg, precision="fp32"))  # stored in float32 or float16, encoded in float32
    where = cfg.model.pretrained or f"built ({cfg.model.architecture})"
    return model.eval(), {name: where for name in model.frozen_components()}


def cmd_precompute(args) -> None:
    from models.errors import WorkbenchError

    from .data import precompute_latents

    vae = args.vae or args.pretrained
    text_encoder = args.text_encoder or args.pretrained
    if args.config and (vae or text_encoder or args.tokenizer):
        raise WorkbenchError("--config encodes with the run's own parts: give it without --pretrained, --vae, "
                             "--text-encoder or --tokenizer")
    if args.set and not args.config:
        raise WorkbenchError("--set overrides a --config; give the config")
    if args.config:
        encoder, refs = run_encoder(args.config, args.set or [])
        parts = {"encoder": encoder, "refs": refs}
    elif not vae or not text_encoder:
        raise WorkbenchError("give --config RUN.yaml (a training config), --pretrained ROOT (a diffusers folder or hub "
                             "id), or both --vae and --text-encoder")
    else:
        parts = {"vae_ref": vae, "text_encoder_ref": text_encoder,
                 "tokenizer_ref": args.tokenizer or (args.pretrained if not args.text_encoder else None)}
    summaries = precompute_latents(args.src, args.out, **parts,
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


def cmd_runs_plot(args) -> None:
    from .callbacks import plot_runs

    print(f"wrote {plot_runs(args.runs, args.out)}")


def cmd_plan(args) -> None:
    from .callbacks import measured_from_run, plan_rows, schedule_samples, table
    from models.errors import WorkbenchError

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
    x = positive_number(value)
    if x > 1:
        raise argparse.ArgumentTypeError(f"a scaling efficiency is at most 1, got {value}")
    return x


def register(sub) -> None:
    """`dwb data ...`, `prepare`, `train`, `runs plot`, `plan`."""
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
    p.add_argument("--samples", type=positive_number, help="the schedule's samples instead of --config")
    p.add_argument("--gpus", type=_counts, default=[8, 16, 32, 64, 128, 256], help="rows (default 8,16,...,256)")
    p.add_argument("--scaling-efficiency", type=_efficiency, default=0.95,
                   help="share of linear speed-up kept per doubling of GPUs, for extrapolated rows (default 0.95)")
    p.add_argument("--usd-per-gpu-hour", type=positive_number, help="price of one GPU-hour (cost column)")
    p.set_defaults(func=cmd_plan)


def register_data(sub) -> None:
    data = sub.add_parser("data", help="make or convert training data (MDS)")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")

    p = data_sub.add_parser("shapes", help="generate the synthetic shapes dataset")
    p.add_argument("out")
    p.add_argument("--n", type=positive, default=16000, help="training samples per bucket")
    p.add_argument("--n-eval", type=int, default=1000, help="held-out samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sizes", type=size_list, default=(16, 32), help="resolution buckets (default 16,32)")
    p.add_argument("--wide", type=share, default=0.0, metavar="SHARE",
                   help="share of scenes in a wide (5:3) or tall (3:5) frame, converted into aspect-ratio buckets "
                        "(default 0: squares only)")
    p.set_defaults(func=cmd_shapes)

    p = data_sub.add_parser("convert", help="WebDataset/img2dataset shards, Parquet, image folders or HF datasets "
                                            "-> MDS resolution buckets")
    p.add_argument("src", nargs="+", help="folders, files, s3:// prefixes or brace patterns (shards/{00000..00099}.tar)")
    p.add_argument("out")
    p.add_argument("--buckets", type=size_list, default=(256, 512),
                   help="minimum-side buckets, or with --aspect-buckets pixel budgets (side x side, at most 4096; "
                        "256 aspect buckets in all) (default 256,512)")
    p.add_argument("--aspect-buckets", action="store_true",
                   help="store each image in the aspect-ratio bucket nearest its own (about side x side pixels), "
                        "covered and centre-cropped, with its original size, crop and bucket")
    p.add_argument("--bucket-step", type=positive,
                   help="aspect buckets' sides are multiples of this (a multiple of 8; default 64 from 512 up, 32 below)")
    p.add_argument("--max-aspect", type=positive_number,
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
    p.add_argument("--workers", type=positive, help="processes converting at once (default: every core)")
    p.add_argument("--part", type=part_of, help="convert only part i of N (i from 0), on one of N machines; "
                                              "then `dwb data join OUT`")
    p.add_argument("--split", default="train")
    p.add_argument("--limit", type=positive)
    p.add_argument("--max-megapixels", type=positive_number,
                   help="skip and count images with more pixels to decode (JPEGs at their reduced draft size); "
                        "converting one takes about 8 bytes a pixel (default 64: today's camera photos)")
    p.add_argument("--max-row-group-mib", type=positive,
                   help="skip and count Parquet row groups whose columns hold more, uncompressed (pyarrow reads a "
                        "group's columns whole; default 1024: img2dataset writes about 30, the hub about 100)")
    p.set_defaults(func=cmd_convert)

    p = data_sub.add_parser("join", help="merge the parts of a `dwb data convert --part i/N` run into one dataset")
    p.add_argument("out", help="the OUT every part wrote into (or each part's OUT copied into one)")
    p.set_defaults(func=cmd_join)
    register_dreambooth(data_sub)

    p = data_sub.add_parser("precompute", help="encode an MDS dataset once: VAE latents and text states per bucket")
    p.add_argument("src", help="an MDS folder of resolution buckets (OUT/256, OUT/512), one MDS dataset, or s3://...")
    p.add_argument("out")
    p.add_argument("--config", help="a training config: encode with its model's frozen parts, as it reads them "
                   "(every family: SDXL's two towers and pooled output, Flux.1's T5 states and CLIP pooled output)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="an override of --config (repeatable)")
    p.add_argument("--pretrained", help="diffusers-layout folder or hub id with vae/, text_encoder/, tokenizer/ "
                   "(one CLIP tower's states: SD 1/2)")
    p.add_argument("--vae", help="the VAE's folder (or a diffusers root); overrides --pretrained")
    p.add_argument("--text-encoder", help="the text encoder's folder (or a diffusers root); overrides --pretrained")
    p.add_argument("--tokenizer", help="default: next to the text encoder")
    p.add_argument("--resolution", type=int, action="append", help="bucket(s) to encode (default: all); "
                   "required for a single dataset")
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--chunk-size", type=positive, default=2048, help="samples per resumable unit of work")
    p.add_argument("--cache", help="local cache folder for a remote SRC")
    p.set_defaults(func=cmd_precompute)


def register_dreambooth(data_sub) -> None:
    p = data_sub.add_parser("dreambooth", help="a small folder of images (with captions, a trigger word, masks) -> "
                                               "an MDS dataset as DreamBooth trains on it, class images included")
    p.add_argument("folder", help="the images, with NAME.txt captions beside them and masks in masks/NAME.png")
    p.add_argument("out")
    p.add_argument("--sizes", type=size_list, default=(512,), help="resolution buckets (default 512)")
    p.add_argument("--template", help='every image\'s caption where it has no NAME.txt, e.g. "a photo of sks {class}" '
                                      '({caption}: its NAME.txt in that place, for every image)')
    p.add_argument("--class-word", help="what {class} stands for in --template and --class-prompt, e.g. dog")
    p.add_argument("--repeats", type=positive, default=1, help="each image this many times per epoch (default 1)")
    p.add_argument("--masks", metavar="FOLDER", help="the masks' folder, NAME.png for NAME.jpg (kohya's "
                   "conditioning_data_dir; default FOLDER/masks): white trains, black is left out, grey in between")
    p.add_argument("--alpha-mask", action="store_true",
                   help="an image's alpha channel is its mask for the loss (where masks/ has none)")
    p.add_argument("--hold-out", type=int, default=0, metavar="N",
                   help="the folder's last N images (by name) held out for validation.path, never trained on")
    p.add_argument("--validation", metavar="FOLDER", help="or: a folder of held-out images (captioned the same way)")
    p.add_argument("--class-prompt", help='prior preservation: the prompt class images are drawn with, e.g. '
                                          '"a photo of a {class}"')
    p.add_argument("--class-images", type=positive, metavar="N", help="class images to draw (kohya: as many as "
                   "images x repeats, one class image per instance sample)")
    p.add_argument("--base", help="the model that draws them: the one you fine-tune (a folder, hub id, single file or "
                                  "checkpoint)")
    p.add_argument("--class-cache", help="where class images are kept, by base and prompt (default: class-images "
                                         "beside OUT)")
    p.add_argument("--class-seed", type=int, default=0, help="class image i is drawn from this seed + i (default 0)")
    p.add_argument("--class-steps", type=positive, help="sampling steps (default: the generation default)")
    p.add_argument("--class-guidance", type=positive_number, help="guidance (default: the generation default)")
    p.add_argument("--class-sampler", help="sampler (default: the generation default)")
    p.add_argument("--class-text-tokens", type=positive, metavar="N",
                   help="T5 tokens to draw with: the run's model.text_tokens (SD3, Flux.1; default: the pipeline's)")
    p.add_argument("--device", default="auto", help="where class images are drawn: auto, cpu or cuda")
    p.add_argument("--image-format", choices=("jpeg", "png"), default="png")
    p.add_argument("--max-megapixels", type=positive_number,
                   help="refuse images with more pixels to decode (default 64: today's camera photos)")
    p.set_defaults(func=cmd_dreambooth)


def register_model(sub) -> None:
    p = sub.add_parser("prepare", help="build the tiny architecture's tokenizer, text encoder and VAE from data")
    p.add_argument("data", help="shapes dataset folder (its 32 px bucket is used)")
    p.add_argument("out")
    p.add_argument("--vae-steps", type=positive, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="run one training phase with Composer")
    p.add_argument("config", help="YAML config, e.g. configs/tiny-phase1.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=cmd_train)
