"""The library's own commands: `dwb export` (any checkpoint out to other tools) and `dwb sample` (a grid from any
checkpoint). Neither trains, so neither loads the training framework."""
from __future__ import annotations

import argparse

from .common import between, from_parser, positive, switch_fraction
from .generation import (DEFAULT_GUIDANCE, DEFAULT_REFINER_SWITCH, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS,
                         MAX_ASPECT, MAX_GUIDANCE, MAX_SEED, MAX_SIZE, MAX_STEPS, MIN_SIZE, RECOMMENDED_KEYS, SAMPLERS,
                         SIZE_STEP, WEIGHT_CHOICES, parse_aspect, parse_size)


def cmd_export(args) -> None:
    from .checkpoints import absent_parts, find_checkpoint, weights_of
    from .export import config_folder, export_checkpoint
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
    bucket of that aspect on the budget side x side (``models.generation.aspect_bucket``, on the family's size step, so
    the family draws it); None where ``size`` is (the native side, known once the pipeline is open). A size given on
    the command line (``given``) and a bucket are checked against the family's step and sides (one line)."""
    from .generation import aspect_bucket
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


def register(sub) -> None:
    """`dwb export` and `dwb sample`."""
    register_export(sub)
    register_sample(sub)


def register_export(sub) -> None:
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


def register_sample(sub) -> None:
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
    p.add_argument("--seed", type=between(-1, MAX_SEED), default=0,
                   help="the first column's seed; column j uses seed + j, as image j of a batch in the app (default 0; "
                        "-1: a random one, printed and recorded)")
    p.add_argument("--seeds", type=positive, default=4, help="columns, seeds --seed to --seed + N - 1 (default 4)")
    p.add_argument("--steps", type=between(1, MAX_STEPS),
                   help=f"sampler steps, 1 to {MAX_STEPS} (default: the checkpoint's recommended, else {DEFAULT_STEPS})")
    p.add_argument("--guidance", type=between(0, MAX_GUIDANCE, float),
                   help=f"classifier-free guidance scale, 0 to {MAX_GUIDANCE:g} (default: the checkpoint's "
                        f"recommended, else {DEFAULT_GUIDANCE:g})")
    p.add_argument("--size", type=from_parser(parse_size), metavar="SIDE|WIDTHxHEIGHT",
                   help=f"image side (a square) or WIDTHxHEIGHT (768x512), each side {MIN_SIZE} to {MAX_SIZE}, a "
                        f"multiple of {SIZE_STEP} and of the family's step (16 for SD3 and Flux.1), within the sides "
                        "its family draws at the checkpoint's resolution (default: the checkpoint's recommended size, "
                        "else its native size, the resolution it was trained at where it records one)")
    p.add_argument("--aspect", type=from_parser(parse_aspect), metavar="W:H",
                   help=f"draw at this aspect ratio (16:9, 2:1, 1:2; up to {MAX_ASPECT:g}:1): the aspect bucket nearest "
                        "it on a budget of --size x --size pixels (default: the native size), as `dwb data convert "
                        "--aspect-buckets` makes them, on the family's step")
    p.add_argument("--sampler", choices=list(SAMPLERS), metavar="NAME",
                   help=f"one of: {', '.join(SAMPLERS)} (default: the checkpoint's recommended, else {DEFAULT_SAMPLER})")
    p.add_argument("--refiner", metavar="REF",
                   help="a second stage that finishes the image: SDXL's refiner (a diffusers folder or hub id) after an "
                        "SDXL base, which stops at --refiner-switch and hands it its latents")
    p.add_argument("--refiner-switch", type=switch_fraction, default=DEFAULT_REFINER_SWITCH, metavar="F",
                   help=f"the fraction of the steps the base takes before the refiner (default {DEFAULT_REFINER_SWITCH:g})")
    p.add_argument("--per-image", action="store_true",
                   help="also each image as its own PNG, in a folder named after OUT (OUT.png: OUT/00000-SEED.png, "
                        "...), each with its parameters; the grid's are its first image's")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--weights", choices=WEIGHT_CHOICES, default=DEFAULT_WEIGHTS,
                         help="a Composer checkpoint's EMA or raw weights (default auto: EMA where it holds them)")
    weights.add_argument("--ema", action="store_true", help="the same as --weights ema")
    p.set_defaults(func=cmd_sample)
