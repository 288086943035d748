"""The library's own commands: `dwb export` (any checkpoint out to other tools) and `dwb sample` (a grid from any
checkpoint). Neither trains, so neither loads the training framework."""
from __future__ import annotations

import argparse

from .common import between, from_parser, positive, switch_fraction
from .errors import WorkbenchError
from .generation import (DEFAULT_GUIDANCE, DEFAULT_REFINER_SWITCH, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS,
                         MAX_ASPECT, MAX_GUIDANCE, MAX_SEED, MAX_SIZE, MAX_STEPS, MIN_SIZE, RECOMMENDED_KEYS, SAMPLERS,
                         SIZE_STEP, WEIGHT_CHOICES, parse_aspect, parse_size)


def cmd_export(args) -> None:
    from .checkpoints import absent_parts, find_checkpoint, weights_of
    from .export import adapter_of, export_adapter, export_checkpoint, single_file_readers
    from .generation import parse_recommended

    settings = {k: v for k, v in (("prediction_type", args.prediction_type), ("latent_scale", args.latent_scale))
                if v is not None}
    recommended = parse_recommended(args.settings) if args.settings else {}
    chosen = weights_of(find_checkpoint(args.checkpoint), "ema" if args.ema else args.weights)
    if args.layout or adapter_of(find_checkpoint(args.checkpoint)) is not None:
        written = export_adapter(args.checkpoint, args.out, layout=args.layout or "diffusers", ema=chosen == "ema")
        print(f"exported the adapter ({'EMA' if chosen == 'ema' else 'raw'} weights) of {args.checkpoint} to "
              f"{written} in the {args.layout or 'diffusers'} layout (docs/adapters.md: which tools read it)")
        return
    out, fmt = export_checkpoint(args.checkpoint, args.out, fmt=args.format, ema=chosen == "ema", half=args.half,
                                 settings=settings, results=args.results or [], studies=args.study or [],
                                 recommended=recommended)
    named = {"ema": "EMA", "raw": "raw", "stored": "the"}[chosen]
    weights = f"{named} weights ({'float16' if args.half else 'float32'})"
    if fmt == "single-file":
        original = out.with_suffix(".yaml")
        beside = f" and its original config {original}" if original.exists() else ""  # SD 1/2's alone
        print(f"exported {weights} of {args.checkpoint} to {out}{beside} ({single_file_readers(out)})")
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

    if seed == -1:
        return random.randint(0, MAX_SEED - n + 1)
    if seed + n - 1 > MAX_SEED:
        raise WorkbenchError(f"--seed {seed} and --seeds {n} go past the last seed, {MAX_SEED}")
    return seed


def cmd_sample(args) -> None:
    from pathlib import Path

    from .checkpoints import (content_hash, describe, find_checkpoint, load_pipeline, native_size_of,
                               recommended_settings, weights_of)
    from .adapters import apply_adapters
    from .families import family_or_ours
    from .generation import (Refiner, Settings, check_prompt_weights, drawn_native_side, image_format,
                             starting_settings, write_rows)

    seed = first_seed(args.seed, args.seeds)
    image_format(args.out)  # before the checkpoint is opened: an output that would carry no parameters
    prompts = sample_prompts(args)  # a prompt file read and checked before the checkpoint is opened
    model_texts, tagged = tagged_loras(prompts, args.lora_dir)  # each <lora:NAME:S> tag found before the weights
    init, hires = modes_of_args(args)  # the init image and mask read (bounded) before the checkpoint is opened
    control_image = control_image_of_args(args, init, hires)  # the same for a control image
    if isinstance(args.size, tuple) and args.aspect:
        raise WorkbenchError("give --size WIDTHxHEIGHT or --aspect W:H (with --size SIDE as its budget), not both")
    ckpt = find_checkpoint(args.checkpoint, parts=args.parts)
    weights = weights_of(ckpt, "ema" if args.ema else args.weights)
    given = {"guidance": args.guidance, "steps": args.steps, "sampler": args.sampler, "size": args.size}
    chosen, recommended = starting_settings(given, recommended_settings(ckpt))
    if init is not None and args.size is None:
        chosen["size"] = init.image.size  # image to image draws at its init image's size unless --size says
    info = describe(ckpt)
    family = family_or_ours(info.family)
    # before the weights are read: a size the family cannot draw is one line (the native size, where only the
    # pipeline knows it, is the model's own)
    size = sample_size(chosen["size"] or drawn_native_side(info.resolution, ckpt.label), args.aspect, family)
    row_sizes = {row.size: sample_size(row.size, args.aspect, family) for row in prompts if row.size is not None}
    # a weighted prompt the family cannot take, or one past the bounds, is one line before the weights are read
    texts = [args.negative_prompt, *(row.prompt for row in prompts), *(row.negative_prompt or "" for row in prompts)]
    check_prompt_weights(family, texts, args.clip_skip)
    check_control_family(control_image, family)
    pipe = load_pipeline(ckpt, ema=weights == "ema")  # a refiner given as the checkpoint is refused here
    files = args.lora or []  # every file judged against the denoiser before any is read
    applied = apply_adapters(pipe, [*files, *((c.file.path, c.strength) for c in tagged)])
    vae = open_vae_arg(args.vae, pipe)  # judged against the checkpoint's own VAE before a tensor is read
    refiner = None
    if args.refiner:
        ref = find_checkpoint(args.refiner)
        refiner = Refiner(load_pipeline(ref, refiner=True), ref.label, content_hash(ref), args.refiner_switch)
    if recommended:  # said once what it applies to has opened
        print(recommended)
    width, height = size or sample_size(native_size_of(ckpt, pipe), args.aspect, family)
    settings = Settings(steps=chosen["steps"], guidance=chosen["guidance"], width=width, height=height,
                        sampler=chosen["sampler"], negative_prompt=args.negative_prompt, refiner=refiner,
                        init=init, hires=hires, clip_skip=args.clip_skip, vae=vae, prompt_weighting=True,
                        control=control_of_args(args, control_image, pipe),
                        loras=tuple((a.name, a.hash, a.strength) for a in applied[:len(files)])
                        + tuple((c.name, c.hash, c.strength) for c in tagged))  # a tag's name, as A1111 records it
    out = Path(args.out)
    images_to = (out.with_suffix("") if out.suffix else out.with_name(f"{out.name}-images")) if args.per_image else None
    out = write_rows(pipe, out, grid_rows(prompts, settings, seed, args.seeds, row_sizes, model_texts),
                     title=f"{ckpt.label} ({content_hash(ckpt)}) {weights} weights",
                     checkpoint=ckpt.label, checkpoint_hash=content_hash(ckpt), weights=weights, images_to=images_to)
    print(f"wrote {out}: {weights} weights, guidance {settings.guidance:g}, {settings.steps} steps, "
          f"{settings.sampler}, {width if width == height else f'{width}x{height}'} px, seeds {seed} to {seed + args.seeds - 1}"
          + (f"; refined by {refiner.name} from {refiner.switch:g} of the steps" if refiner else "")
          + (f"; VAE {vae.name} ({vae.hash})" if vae else "")
          + (f"; {len(prompts)} prompts from {args.prompts} (a row's own seed, size and negative prompt where it "
             "gives them)" if args.prompts else "")
          + (f"; each image in {images_to}" if images_to else "") + control_line(settings.control)
          + "".join(f"; {a.kind} {a.name} ({a.hash}, {a.layout} layout) at {a.strength:g}" for a in applied))


def open_vae_arg(path, pipe):
    """The VAE ``--vae`` names, opened for ``pipe`` (``models.checkpoints.open_vae``); None without it."""
    from .checkpoints import open_vae

    return open_vae(path, pipe) if path else None


def modes_of_args(args):
    """(init image, hires fix) of `dwb sample`'s flags (``models.generation``), each None where not asked for; the
    images read within bounds, and a one-line WorkbenchError for flags that do not go together."""
    from .generation import DEFAULT_HIRES_STRENGTH, DEFAULT_STRENGTH, HiresFix, InitImage, read_image

    if args.mask and not args.init_image:
        raise WorkbenchError("--mask marks what to redraw of an --init-image: give both")
    if args.init_image and args.hires_scale:
        raise WorkbenchError("--hires-scale enlarges a drawing from text: give it without --init-image")
    init = hires = None
    if args.init_image:
        mask = read_image(args.mask, "--mask") if args.mask else None
        init = InitImage(read_image(args.init_image, "--init-image"), args.strength or DEFAULT_STRENGTH, mask,
                         args.mask_blur)
    if args.hires_scale:
        hires = HiresFix(args.hires_scale, args.hires_steps, args.hires_upscaler,
                         args.strength or DEFAULT_HIRES_STRENGTH)
    elif args.strength is not None and not args.init_image:
        raise WorkbenchError("--strength is how much of an --init-image (or a --hires-scale draw) is redrawn: give one")
    return init, hires


def control_image_of_args(args, init, hires):
    """The control image `dwb sample --controlnet` is given, read within bounds (None without --controlnet); one line
    for flags that do not go together."""
    from .generation import read_image

    if args.control_image and not args.controlnet:
        raise WorkbenchError("--control-image steers through a --controlnet: give both")
    if not args.controlnet:
        return None
    if not args.control_image:
        raise WorkbenchError("--controlnet steers from a --control-image: give both")
    if init is not None or hires is not None or args.refiner:
        raise WorkbenchError("--controlnet steers a text-to-image draw here: give it without --init-image, "
                             "--hires-scale or --refiner")
    return read_image(args.control_image, "--control-image")


def check_control_family(image, family) -> None:
    """One line, before the checkpoint's weights are read, where a ControlNet is given to a family without one."""
    from .checkpoints import check_takes_controlnet

    if image is not None:
        check_takes_controlnet(family)


def control_of_args(args, image, pipe):
    """The ControlNet `dwb sample` steers with (``models.generation.Control``), opened through the door against the
    pipeline's family and UNet; None without one."""
    from .checkpoints import open_controlnet
    from .generation import Control

    if image is None:
        return None
    opened = open_controlnet(args.controlnet, pipe)
    return Control(opened.model, opened.name, opened.hash, image, args.control_preprocess, args.control_strength,
                   args.control_start, args.control_end)


def control_line(control) -> str:
    if control is None:
        return ""
    return (f"; steered by ControlNet {control.name} ({control.hash}, preprocess {control.module}) at "
            f"{control.weight:g} from {control.start:g} to {control.end:g} of the steps")


def sample_prompts(args) -> list:
    """The rows `dwb sample` draws (``models.generation.PromptRow``): each ``--prompt``, or each row of ``--prompts
    FILE`` with its own first seed, size and negative prompt where the file gives them (a seed whose ``--seeds``
    columns would pass the last seed is one line here), or the demo prompts."""
    from .generation import DEMO_PROMPTS, PromptRow, read_sample_prompts

    if args.prompts and args.prompt:
        raise WorkbenchError("give --prompt (repeatable) or --prompts FILE, not both")
    if not args.prompts:
        return [PromptRow(prompt) for prompt in args.prompt or DEMO_PROMPTS]
    rows = read_sample_prompts(args.prompts)
    for row in rows:
        if row.seed is not None:
            first_seed(row.seed, args.seeds)
    return rows


def grid_rows(prompts: list, settings, seed: int, n: int, sizes: dict, texts: list[str] | None = None) -> list:
    """Each row as a grid row (``models.generation.GridRow``): ``n`` seeds from its own first seed (else ``seed``), at
    its own size (``sizes``: as drawn) and with its own negative prompt over the command's ``settings``; rows with
    none of their own share ``settings``, so they are drawn in one batch as a grid of --prompt rows is. ``texts``:
    each row's prompt as the model reads it (its LoRA tags taken out), where it differs from the prompt recorded."""
    from dataclasses import replace

    from .generation import GridRow

    rows = []
    for i, row in enumerate(prompts):
        first = seed if row.seed is None else row.seed
        own = {} if row.size is None else dict(zip(("width", "height"), sizes[row.size]))
        if row.negative_prompt is not None:
            own["negative_prompt"] = row.negative_prompt
        text = texts[i] if texts is not None and texts[i] != row.prompt else None
        rows.append(GridRow(row.prompt, tuple(range(first, first + n)), replace(settings, **own) if own else settings,
                            text))
    return rows


def tagged_loras(prompts: list, lora_dir: str | None) -> tuple[list[str], tuple]:
    """(each row's prompt as the model reads it, the LoRAs its ``<lora:NAME:STRENGTH>`` tags name): names found in
    ``lora_dir`` by the app's rule (``models.checkpoints.LoraFiles``); one-line WorkbenchError for a tag without
    ``--lora-dir``, a name not found there, or rows whose tags differ (one set of LoRAs draws every row)."""
    from pathlib import Path

    from .generation import lora_tags

    if not any(lora_tags(row.prompt)[1] for row in prompts):
        return [row.prompt for row in prompts], ()
    if lora_dir is None:
        raise WorkbenchError("the prompt's <lora:NAME:STRENGTH> tags name LoRA files: give --lora-dir FOLDER, where "
                             "they are found by name (or apply a file with --lora FILE:STRENGTH)")
    if not Path(lora_dir).is_dir():
        raise WorkbenchError(f"--lora-dir {lora_dir}: no such folder")
    from .checkpoints import LoraFiles

    files = LoraFiles([Path(lora_dir).resolve()], where=f"--lora-dir {lora_dir}")
    resolved = [files.chosen(row.prompt) for row in prompts]
    if len({tuple(c.key() for c in chosen) for _, chosen in resolved}) > 1:
        raise WorkbenchError("the prompts' <lora:...> tags name different LoRAs or strengths: one set of LoRAs draws "
                             "every row of `dwb sample` (draw each set with a command of its own)")
    return [text for text, _ in resolved], resolved[0][1]


def sample_size(size, aspect, family) -> tuple[int, int] | None:
    """(width, height) `dwb sample` draws at: ``size`` as WIDTHxHEIGHT, a square of its side, or with ``aspect`` the
    bucket of that aspect on the budget side x side (``models.generation.aspect_bucket``, on the family's size step, so
    the family draws it); None where ``size`` is (the native side, known once the pipeline is open). Each is held to
    the one size rule (``models.generation.check_drawable``); an aspect whose bucket is the square is one line."""
    from .generation import aspect_bucket, check_drawable

    if size is None:
        return None
    if isinstance(size, tuple):
        check_drawable(family, size, "--size")
        return size
    check_drawable(family, (size, size), "--size" if aspect is None else "--aspect's budget")
    if aspect is None:
        return size, size
    bucket = aspect_bucket(aspect, size, family.size_step())
    where = f"the {aspect[0]:g}:{aspect[1]:g} bucket of {size} px"
    if bucket[0] == bucket[1] and aspect[0] != aspect[1]:
        raise WorkbenchError(f"{where} on {family.label}'s step of {family.size_step()} is the square {size}x{size}: "
                             "no bucket of that budget is nearer the aspect; give a larger --size")
    check_drawable(family, bucket, where)
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
    p.add_argument("--layout", choices=("diffusers", "kohya", "peft", "comfyui"),
                   help="an adapter checkpoint (a run with an adapter: section) to OUT.safetensors in this layout: "
                        "diffusers (load_lora_weights), kohya (kohya, AUTOMATIC1111, ComfyUI), peft (every kind), "
                        "comfyui (ComfyUI's own names: SD3, Flux.1); default for an adapter checkpoint: diffusers")
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
    p.add_argument("--prompt", action="append",
                   help="repeatable; default: the demo prompts; AUTOMATIC1111's weighting, (word:1.2), (word), [word] "
                        "and BREAK, through compel for SD 1/2 and SDXL (docs/sample.md#prompt-weighting)")
    p.add_argument("--prompts", metavar="FILE",
                   help="the rows from a file: a .csv or .tsv with a prompt column and optional seed, size (SIDE or "
                        "WxH) and negative_prompt columns, each row's own where its cell is not empty; any other file "
                        "one prompt a line (# starts a comment line)")
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
                        f"multiple of {SIZE_STEP} and of the family's step (16 for SD3 and Flux.1) (default: the "
                        "checkpoint's recommended size, else its native size, the resolution it was trained at where "
                        "it records one)")
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
    p.add_argument("--lora", action="append", type=from_parser(_adapter_arg), metavar="FILE[:STRENGTH]",
                   help="repeatable: an adapter file applied at STRENGTH (default 1; several stack): LoRA in the "
                        "diffusers, kohya/AUTOMATIC1111 or peft layout, DoRA, LoHa, LoKr (docs/adapters.md)")
    p.add_argument("--vae", metavar="PATH",
                   help="draw with this VAE in place of the checkpoint's own (AUTOMATIC1111's SD VAE): a diffusers "
                        "AutoencoderKL folder or one .safetensors file (diffusers' or the original layout); it must "
                        "make the checkpoint's latents (channels, scaling): a VAE of another family is refused")
    p.add_argument("--lora-dir", metavar="FOLDER",
                   help="where the prompt's AUTOMATIC1111 tags <lora:NAME:STRENGTH> find their files: NAME is a file's "
                        "stem or its path under FOLDER, as the app finds them under its folders; the tag is taken out "
                        "of the text the model reads and kept in the prompt the PNG records")
    register_modes(p)
    register_control(p)
    p.set_defaults(func=cmd_sample)


def _adapter_arg(text: str):
    from .adapters import parse_adapter_arg

    return parse_adapter_arg(text)


def register_modes(p) -> None:
    """`dwb sample`'s image to image, inpainting and hires fix (``models.generation.modes``), and clip skip."""
    from .generation import (DEFAULT_HIRES_STRENGTH, DEFAULT_HIRES_UPSCALER, DEFAULT_MASK_BLUR, DEFAULT_STRENGTH,
                             HIRES_UPSCALERS, MAX_CLIP_SKIP, MAX_HIRES_SCALE, MAX_MASK_BLUR)

    p.add_argument("--init-image", metavar="IMAGE",
                   help="draw from this PNG, JPEG or WebP (image to image), at its size unless --size says another "
                        "(it is resized to it)")
    p.add_argument("--mask", metavar="IMAGE", help="inpaint: white redraws, black keeps (the init image's size)")
    p.add_argument("--strength", type=from_parser(_strength), metavar="F",
                   help=f"denoising strength in (0, 1]: the share of the steps redrawn (default {DEFAULT_STRENGTH:g} "
                        f"for --init-image, {DEFAULT_HIRES_STRENGTH:g} for --hires-scale)")
    p.add_argument("--mask-blur", type=between(0, MAX_MASK_BLUR), default=DEFAULT_MASK_BLUR, metavar="PX",
                   help=f"the mask's Gaussian blur in pixels (default {DEFAULT_MASK_BLUR})")
    p.add_argument("--hires-scale", type=from_parser(_hires_scale), metavar="F",
                   help=f"hires fix: draw at --size, enlarge F times (up to {MAX_HIRES_SCALE:g}) and redraw at "
                        "--strength")
    p.add_argument("--hires-steps", type=between(0, MAX_STEPS), default=0, metavar="N",
                   help="the hires fix's redrawing steps (default 0: as many as --steps)")
    p.add_argument("--hires-upscaler", choices=HIRES_UPSCALERS, default=DEFAULT_HIRES_UPSCALER, metavar="NAME",
                   help=f"one of: {', '.join(HIRES_UPSCALERS)} (default {DEFAULT_HIRES_UPSCALER}: the latents)")
    p.add_argument("--clip-skip", type=between(1, MAX_CLIP_SKIP), default=1, metavar="N",
                   help="condition on the CLIP towers' layer N from the end (AUTOMATIC1111's Clip skip; default 1: "
                        "the usual one; SD 1/2, SDXL, SD3)")


def register_control(p) -> None:
    """`dwb sample`'s ControlNet (``models.generation.Control``), with AUTOMATIC1111's ControlNet extension's defaults."""
    from .generation import CONTROL_MODULES, DEFAULT_CANNY, MAX_CONTROL_WEIGHT

    p.add_argument("--controlnet", metavar="REF",
                   help="a ControlNet steering the draw (SD 1/2, SDXL): a diffusers folder, a .safetensors file (diffusers' "
                        "or ControlNet 1.x's original key names), or a hub id; one made for the checkpoint's own model")
    p.add_argument("--control-image", metavar="IMAGE",
                   help="the ControlNet's image (PNG, JPEG or WebP), stretched to the drawn size")
    p.add_argument("--control-preprocess", choices=CONTROL_MODULES, default="none",
                   help="make the control image from the upload first: canny edges (thresholds "
                        f"{DEFAULT_CANNY[0]} and {DEFAULT_CANNY[1]}, as A1111's), or none (default: the image as given)")
    p.add_argument("--control-strength", type=between(0, MAX_CONTROL_WEIGHT, float), default=1.0, metavar="S",
                   help=f"the ControlNet's weight, 0 to {MAX_CONTROL_WEIGHT:g} (default 1)")
    p.add_argument("--control-start", type=between(0, 1, float), default=0.0, metavar="A",
                   help="the share of the steps before the ControlNet steers (default 0)")
    p.add_argument("--control-end", type=between(0, 1, float), default=1.0, metavar="B",
                   help="the share of the steps after which it stops (default 1)")


def _strength(text: str) -> float:
    from .generation import check_strength

    return check_strength(text)


def _hires_scale(text: str) -> float:
    from .generation import HiresFix

    try:
        scale = float(text)
    except ValueError:
        raise WorkbenchError(f"hires upscale must be a number, got {text[:40]!r}") from None
    return HiresFix(scale=scale).scale
