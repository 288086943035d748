"""PNG Info: the generation parameters a PNG carries (ours or AUTOMATIC1111's), as values for the controls; a
JPEG's or WebP's too, from its EXIF UserComment (as A1111 writes them; read from the header, before any pixel).

The ``parameters`` text chunk is read from the file's chunks before its pixels, so a PNG whose pixels would
take gigabytes to decode costs nothing to read; text written after the pixels is looked for only in images
of at most ``MAX_PIXELS``. Our PNGs also carry the exact record as JSON (``dwb``), which is read in preference to
the text (whose prompts have their line breaks written as spaces). Our PNGs name their checkpoint by content hash
("Model hash"), which the app looks up under its folders; AUTOMATIC1111's hashes (10 hex digits, of other files)
find nothing, and say so. LoRAs are found by their ``Lora hashes`` among the LoRA files under the folders
(``models.checkpoints.LoraFiles``), and the prompt's ``<lora:NAME:S>`` tags name them.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from models.errors import WorkbenchError
from models.generation import (CONTROL_MODULES, HIRES_UPSCALERS, MAX_CONTROL_WEIGHT, SAMPLERS, ImageRecord, control_of,
                               lora_tag, lora_tags, modes_of, named_values, parameters_from_exif, parse_parameters,
                               refiner_of)

MAX_PIXELS = 4096 * 4096
# Our text is two prompts of at most 2,000 characters and a settings line of a few hundred; AUTOMATIC1111's with
# its extensions' fields a few thousand. PIL reads text chunks of up to 1 MB, which the upload cap lets through:
# longer text is refused before it is parsed.
MAX_PARAMETERS_CHARS = 64 * 1024
WEIGHTS = {"EMA": "ema", "raw": "raw"}
# The numbers a field is read as. A seed has at most 10 digits (2^32 - 1), steps 3, a guidance scale a few
# characters; a float's shortest text at most 24. Longer text is not read: int() raised Python's own error on a
# 5,000-digit Size. A whole number must fit the page's JSON, whose numbers a browser holds whole up to 2^53
# (a 4,000-digit Seed made the values' JSON raise TypeError).
MAX_NUMBER_CHARS = 32
MAX_WHOLE = 2**53


def read_parameters(path: str | Path) -> str:
    """The ``parameters`` text of a PNG file; one-line WorkbenchError for another file or a PNG without it."""
    return read_png_info(path)[0]


def read_png_info(path: str | Path) -> tuple[str, ImageRecord | None]:
    """A PNG's ``parameters`` text, and the exact record of its ``dwb`` chunk when it has a valid one (our PNGs);
    one-line WorkbenchError for another file or a PNG without parameters."""
    text, record, _ = read_png(path)
    return text, record


def read_png(path: str | Path) -> tuple[str, ImageRecord | None, str | None]:
    """``read_png_info``, and why the PNG's ``dwb`` chunk was not read where it has one that is unreadable (too
    long, too deep, not JSON, not a whole record): one line, for PNG Info's notes."""
    try:
        with Image.open(path, formats=["PNG", "JPEG", "WEBP"]) as image:
            if image.format != "PNG":  # EXIF is read from its header segment, before any pixel
                text, chunk = parameters_from_exif(image.info.get("exif") or b""), None
                return _checked(text, None, image.format)
            info = image.info
            if "parameters" not in info and image.width * image.height <= MAX_PIXELS:
                image.load()  # some writers put text chunks after the pixels
                info = image.info
            text, chunk = info.get("parameters"), info.get("dwb")
    except Image.DecompressionBombError:
        text, chunk = None, None
    except (OSError, SyntaxError, ValueError) as e:
        raise WorkbenchError(f"not a readable PNG image, nor a JPEG or WebP ({type(e).__name__})") from None
    return _checked(text, chunk, "PNG")


def _checked(text, chunk, fmt: str) -> tuple[str, ImageRecord | None, str | None]:
    """``read_png``'s answer from an image's parameters text and ``dwb`` chunk (a PNG's only)."""
    if not isinstance(text, str) or not text.strip():
        where = "no 'parameters' text chunk" if fmt == "PNG" else "no EXIF UserComment"
        raise WorkbenchError(f"this {fmt} carries no generation parameters ({where})")
    if len(text) > MAX_PARAMETERS_CHARS:
        raise WorkbenchError(f"this {fmt}'s parameters text is {len(text):,} characters long; at most "
                             f"{MAX_PARAMETERS_CHARS:,} are read")
    if chunk is None:
        return text, None, None
    try:
        return text, ImageRecord.from_chunk(chunk), None
    except WorkbenchError as e:  # the parameters text is read instead
        return text, None, f"{e}; its parameters text was read instead"


def _sampler(parsed: dict) -> str | None:
    """Our sampler name; AUTOMATIC1111 1.6+ writes "Sampler: DPM++ 2M, Schedule type: Karras"."""
    name = parsed.get("Sampler", "")
    schedule = parsed.get("Schedule type", "")
    for candidate in (f"{name} {schedule}".strip(), name):
        if candidate in SAMPLERS:
            return candidate
    return None


def _number(parsed: dict, key: str, kind: type, notes: list[str]):
    """The field ``key`` as an int or float; None where it is missing or no number, and, with a note, where it is
    one this app cannot use (over MAX_NUMBER_CHARS, past MAX_WHOLE, infinite)."""
    value = parsed.get(key)
    if isinstance(value, int) and not isinstance(value, bool):  # a record's field (JSON: at most 4,300 digits)
        number = value
    else:
        text = str(value if value is not None else "").strip()
        if len(text) > MAX_NUMBER_CHARS:
            notes.append(f"{key} is a number of {len(text):,} characters, which this app does not read; "
                         "the current one is kept")
            return None
        try:
            number = kind(text)
        except ValueError:
            return None
    limit = MAX_WHOLE if kind is int else sys.float_info.max
    if not -limit <= number <= limit:  # also NaN and infinity
        shown = (f"{number:g}" if isinstance(number, float) else str(number) if abs(number) < 10**MAX_NUMBER_CHARS
                 else f"of {len(str(abs(number))):,} digits")
        notes.append(f"{key} {shown} is not a number this app can use; the current one is kept")
        return None
    return float(number) if kind is float else number


def _size(parsed: dict, notes: list[str]) -> tuple[int | None, int | None]:
    """(width, height) of the ``Size`` field ("512x768"); (None, None) where it has none, and, with a note, where
    a side is longer than MAX_NUMBER_CHARS."""
    text = str(parsed.get("Size", ""))
    size = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if size is None:
        return None, None
    if any(len(side) > MAX_NUMBER_CHARS for side in size.groups()):
        notes.append(f"Size is {len(text):,} characters long, more than a size this app reads; the current one is "
                     "kept")
        return None, None
    return int(size.group(1)), int(size.group(2))


def fields_of(record: ImageRecord) -> dict:
    """A record under the names of the ``parameters`` text's fields (what ``parse_parameters`` returns)."""
    return {"prompt": record.prompt, "negative_prompt": record.negative_prompt, "Sampler": record.sampler,
            "Steps": record.steps, "CFG scale": record.guidance, "Size": f"{record.width}x{record.height}",
            "Seed": record.seed, "Model hash": record.checkpoint_hash, "Model": record.checkpoint,
            "Weights": {"ema": "EMA"}.get(record.weights, record.weights), **dict(record.refiner_fields()),
            **dict(record.mode_fields()), **({"Clip skip": record.clip_skip} if record.clip_skip > 1 else {}),
            **({"Lora hashes": record.lora_hashes, "lora_strengths": record.lora_strengths} if record.lora_hashes
               else {}), **({"VAE": record.vae, "VAE hash": record.vae_hash} if record.vae else {}),
            **({"ControlNet 0": record.control_unit()} if record.controlnet else {})}


def _guidance(parsed: dict, notes: list[str]) -> float | None:
    """The guidance scale: Forge's "Distilled CFG Scale" where a model takes it as an input (Flux.1-dev: its "CFG
    scale" is then 1, no second pass), else "CFG scale"."""
    distilled = _number(parsed, "Distilled CFG Scale", float, notes) if "Distilled CFG Scale" in parsed else None
    return distilled if distilled is not None else _number(parsed, "CFG scale", float, notes)


def settings_from(text: str, label_of_hash: Callable[[str], str | None],
                  record: ImageRecord | None = None,
                  lora_of_hash: Callable[[str], str | None] = lambda digest: None,
                  vae_of: Callable[[str, str], str | None] = lambda name, digest: None,
                  controlnet_of: Callable[[str, str], str | None] = lambda name, digest: None
                  ) -> tuple[dict, list[str]]:
    """Control values from a PNG's exact record where it has one, else from its ``parameters`` text (None where
    it says nothing usable), and notes on what was not carried over: ``prompt, negative_prompt, sampler,
    steps, guidance, width, height, seed, checkpoint, weights, refiner, refiner_switch``, the mode's, and ``loras``
    (the LoRAs found by their hash, each ``(NAME, strength)``: the prompt's ``<lora:NAME:S>`` tags name them)."""
    parsed = fields_of(record) if record is not None else parse_parameters(text)
    notes: list[str] = []
    width, height = _size(parsed, notes)
    values = {"prompt": parsed.get("prompt", ""), "negative_prompt": parsed.get("negative_prompt", ""),
              "sampler": _sampler(parsed), "steps": _number(parsed, "Steps", int, notes),
              "guidance": _guidance(parsed, notes), "width": width, "height": height,
              "seed": _number(parsed, "Seed", int, notes), "checkpoint": None,
              "weights": WEIGHTS.get(parsed.get("Weights", ""))}
    if values["sampler"] is None and parsed.get("Sampler"):
        notes.append(f"sampler {parsed['Sampler']!r} is not one of this app's; the current one is kept")
    digest = parsed.get("Model hash", "").strip()
    if digest:
        values["checkpoint"] = label_of_hash(digest.lower())
        if values["checkpoint"] is None:
            model = f" ({parsed['Model']})" if parsed.get("Model") else ""
            notes.append(f"no checkpoint under the app's folders has the model hash {digest}{model}; "
                         "the current one is kept")
    values.update(_refiner(parsed, label_of_hash, notes))
    values.update(_modes(parsed, notes))
    values.update(_loras(str(values["prompt"]), parsed, lora_of_hash, notes))
    values["vae"] = _vae(parsed, vae_of, notes)
    values.update(_control(parsed, controlnet_of, notes))
    return values, notes


def _control(parsed: dict, controlnet_of: Callable[[str, str], str | None], notes: list[str]) -> dict:
    """The ControlNet accordion's values of the first ControlNet unit (``models.generation.control_of``): the
    ControlNet found under the app's folders by its name and hash ("" for an image drawn without one: a stale one
    would draw another image), its preprocessor, weight, start and end (None where unusable); a note that the
    control image must be uploaded again, or that the ControlNet was not found."""
    unit = control_of(parsed)
    if unit is None:
        return {"controlnet": "", "control_preprocess": None, "control_weight": None, "control_start": None,
                "control_end": None}
    label = controlnet_of(unit["model"], unit["hash"]) if unit["hash"] else None
    notes.append(f"steered by ControlNet {unit['model']}: upload its control image in Generate's ControlNet section"
                 if label else f"no ControlNet under the app's folders is named {unit['model']} with the hash "
                 f"{unit['hash'] or '(none given)'}; the current one is kept")
    module = unit.get("module")
    values = {"controlnet": label, "control_preprocess": module if module in CONTROL_MODULES else None}
    for key, top in (("weight", MAX_CONTROL_WEIGHT), ("start", 1.0), ("end", 1.0)):
        number = _number({key: unit[key]}, key, float, notes) if key in unit else None
        values[f"control_{key}"] = number if number is not None and 0 <= number <= top else None
    if module not in CONTROL_MODULES:
        notes.append(f"ControlNet preprocessor {str(module)[:40]!r} is not one of this app's; the current one is kept")
    return values


def _vae(parsed: dict, vae_of: Callable[[str, str], str | None], notes: list[str]) -> str | None:
    """The VAE field: the file under the app's folders that ``VAE: NAME, VAE hash: HASH`` name (``vae_of``), "" for an
    image drawn with its checkpoint's own (a stale VAE would draw another image), None (kept) where none is found."""
    name, digest = str(parsed.get("VAE", "")).strip(), str(parsed.get("VAE hash", "")).strip()
    if not name:
        return ""
    label = vae_of(name, digest) if digest else None
    if label is None:
        notes.append(f"no VAE under the app's folders is named {name[:80]} with the hash {digest[:20] or '(none)'}; "
                     "the current one is kept")
    return label


def _loras(prompt: str, parsed: dict, lora_of_hash: Callable[[str], str | None], notes: list[str]) -> dict:
    """The prompt with a ``<lora:NAME:S>`` tag for each LoRA of ``Lora hashes`` found under the app's folders by its
    hash: an A1111 prompt's own tag renamed to the file found (its strength kept), or one added at the strength the
    record gives (1 where it gives none: `dwb sample --lora` writes no tag); and those LoRAs as (NAME, strength)."""
    pairs = named_values(parsed.get("Lora hashes", ""))
    if not pairs:
        return {"prompt": prompt, "loras": []}
    strengths = dict(named_values(parsed.get("lora_strengths", "")))
    try:
        lora_tags(prompt)
    except WorkbenchError as e:
        notes.append(f"its LoRA tags do not read ({e}); its LoRAs are not restored")
        return {"prompt": prompt, "loras": []}
    found = []
    for name, digest in pairs:
        file = lora_of_hash(digest)
        if file is None:
            notes.append(f"no LoRA under the app's folders has the hash {digest} ({name}); Generate refuses its tag "
                         "until one does")
            continue
        tags = {t.name.replace(":", "").replace(",", ""): t for t in lora_tags(prompt)[1]}
        tag = tags.get(name)
        strength = tag.strength if tag else _strength(strengths.get(name))
        new = lora_tag(file, strength)
        prompt = prompt[:tag.span[0]] + new + prompt[tag.span[1]:] if tag else f"{prompt} {new}"
        found.append((file, strength))
    return {"prompt": prompt, "loras": found}


def _strength(text: str | None) -> float:
    """A recorded strength; 1 where there is none or it is no finite number (A1111's default)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return 1.0
    return value if abs(value) < 1e6 else 1.0


def _modes(parsed: dict, notes: list[str]) -> dict:
    """What the image was drawn from (``models.generation.modes_of``) as the Generate tab's mode controls: the mode's
    tab, the denoising strength, mask blur and hires fix (an upscale of 1, no hires fix, for an image drawn without
    one: a stale one would draw another image); a note where the image to start from must be uploaded again."""
    mode = modes_of(parsed)["mode"] or "txt2img"
    values = {"mode": mode, "strength": _number(parsed, "Denoising strength", float, notes), "mask_blur": None,
              "hires_scale": 1.0, "hires_steps": 0, "hires_upscaler": None,
              "clip_skip": _number(parsed, "Clip skip", int, notes) or 1}  # A1111 writes it only above 1
    if values["strength"] is not None and not 0 < values["strength"] <= 1:
        notes.append(f"Denoising strength {values['strength']:g} is not in (0, 1]; the current one is kept")
        values["strength"] = None
    if mode == "inpaint":
        values["mask_blur"] = _number(parsed, "Mask blur", int, notes)
    if mode != "txt2img":
        notes.append(f"drawn {'by inpainting' if mode == 'inpaint' else 'from an image'}: upload that image in "
                     f"Generate's {'Inpaint' if mode == 'inpaint' else 'Image to image'} tab to draw it again")
    elif "Hires upscale" in parsed or "Hires upscaler" in parsed:
        upscaler = parsed.get("Hires upscaler")
        values.update(hires_scale=_number(parsed, "Hires upscale", float, notes),
                      hires_steps=_number(parsed, "Hires steps", int, notes) or 0,
                      hires_upscaler=upscaler if upscaler in HIRES_UPSCALERS else None)
        if upscaler not in HIRES_UPSCALERS:
            notes.append(f"hires upscaler {str(upscaler)[:40]!r} is not one of this app's; the current one is kept")
    return values


def _refiner(parsed: dict, label_of_hash: Callable[[str], str | None], notes: list[str]) -> dict:
    """The refiner field ("" for an image drawn without one: a stale refiner would draw another image) and its
    switch, the refiner found under the app's folders by its hash."""
    refined = refiner_of(parsed)
    if refined is None:
        return {"refiner": "", "refiner_switch": None}
    name, digest, switch = refined
    label = label_of_hash(digest.lower()) if digest else None
    if label is None:
        notes.append(f"no refiner under the app's folders has the hash {digest or '(none given)'} ({name}); "
                     "the current one is kept")
    return {"refiner": label, "refiner_switch": switch}
