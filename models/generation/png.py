"""PNG parameters: the one record of how an image was made, written into its PNG and read back.

``ImageRecord`` is what makes an image again: written into its PNG as AUTOMATIC1111's ``parameters`` text
(which image viewers and A1111's PNG Info read) and as JSON (``dwb``), and read back by ``parse_parameters``
from ours and A1111's.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields

from PIL import Image, PngImagePlugin

from ..common import loads_outside
from ..errors import WorkbenchError, first_line
from .images import Settings

MAX_RECORD_CHARS = 64 * 1024  # ours is two prompts of at most 2,000 characters and a dozen short fields


@dataclass
class ImageRecord:
    """Everything needed to make one image again."""

    prompt: str
    negative_prompt: str
    sampler: str
    steps: int
    guidance: float
    width: int
    height: int
    seed: int  # this image's own seed
    checkpoint: str  # the checkpoint's label
    checkpoint_hash: str  # models.checkpoints.content_hash
    weights: str  # "ema" or "raw" (a Composer checkpoint), "stored" (the one set a file holds)
    software: str = field(default="diffusion-workbench")
    # how the model took ``guidance`` (models.families.GUIDANCE_KINDS): classifier-free, distilled into the model
    # (Flux.1-dev) or none (Flux.1-schnell)
    guidance_kind: str = field(default="cfg")
    # the second stage that finished the image (``Settings.refiner``): its label and hash, and the fraction of the
    # steps the base took; "" where the base drew it alone
    refiner: str = field(default="")
    refiner_hash: str = field(default="")
    refiner_switch: float = field(default=0.0)
    # what the image was drawn from besides noise (``Settings.init``, ``Settings.hires``): "img2img" or "inpaint" (an
    # init image, with a mask), "txt2img" with a hires fix, "" from text alone; the denoising strength of either,
    # the mask's blur, and the hires fix's upscale, steps (0: the first draw's) and upscaler, as A1111 names them
    mode: str = field(default="")
    strength: float = field(default=0.0)
    mask_blur: int = field(default=0)
    hires_scale: float = field(default=0.0)
    hires_steps: int = field(default=0)
    hires_upscaler: str = field(default="")
    # the LoRAs applied, as AUTOMATIC1111's Lora extension writes them ("NAME: HASH, NAME: HASH", its short hash),
    # and their strengths ("NAME: 0.8, ..."), which A1111 keeps in the prompt's <lora:NAME:0.8> and ours in the record
    lora_hashes: str = field(default="")
    lora_strengths: str = field(default="")
    clip_skip: int = field(default=1)  # A1111's "Clip skip" (``Settings.clip_skip``; 1: the towers' usual layer)
    # the ControlNet that steered the image (``Settings.control``): its name and hash, its preprocessor and canny's
    # thresholds, its weight and the share of the steps it steered, written as A1111's ControlNet extension writes a
    # unit ("ControlNet 0"); "" where none did
    controlnet: str = field(default="")
    controlnet_hash: str = field(default="")
    control_module: str = field(default="")
    control_weight: float = field(default=0.0)
    control_start: float = field(default=0.0)
    control_end: float = field(default=0.0)
    control_low: int = field(default=0)
    control_high: int = field(default=0)
    # the VAE drawn with in place of the checkpoint's (``Settings.vae``): its file's name and AUTOMATIC1111's hash of
    # it, written as A1111 writes them ("VAE hash: HASH, VAE: NAME"); "" where the checkpoint's own drew
    vae: str = field(default="")
    vae_hash: str = field(default="")

    @classmethod
    def of(cls, settings: Settings, prompt: str, seed: int, size: tuple[int, int], sampler: str, checkpoint: str,
           checkpoint_hash: str, weights: str, guidance_kind: str = "cfg") -> "ImageRecord":
        refiner = settings.refiner
        if settings.hires is not None and settings.width and settings.height:
            size = (settings.width, settings.height)  # A1111's Size: the first draw's, which Hires upscale enlarges
        stage = {} if refiner is None else dict(refiner=refiner.name, refiner_hash=refiner.hash,
                                                refiner_switch=refiner.switch)
        return cls(prompt, settings.negative_prompt, sampler, settings.steps, float(settings.guidance), size[0],
                   size[1], int(seed), checkpoint, checkpoint_hash, weights, guidance_kind=guidance_kind, **stage,
                   **_modes_of(settings), **_loras_of(settings), clip_skip=settings.clip_skip,
                   **_control_of(settings),
                   **({} if settings.vae is None else dict(vae=settings.vae.name, vae_hash=settings.vae.hash)))

    def refiner_fields(self) -> list[tuple[str, str]]:
        """The refiner as A1111 and Forge write it: "Refiner: NAME [HASH], Refiner switch at: 0.8"; none without."""
        if not self.refiner:
            return []
        return [("Refiner", _quote(f"{self.refiner} [{self.refiner_hash}]")),
                ("Refiner switch at", f"{self.refiner_switch:g}")]

    def mode_fields(self) -> list[tuple[str, str]]:
        """What the image was drawn from, as A1111 writes it: "Denoising strength: 0.75" (image to image, and the
        hires fix's), "Mask blur: 4" (inpainting), "Hires upscale: 2, Hires steps: 10, Hires upscaler: Latent" (hires
        steps only where they are not the first draw's); none for an image from text alone."""
        fields = [("Denoising strength", f"{self.strength:g}")] if self.mode else []
        if self.mode == "inpaint":
            fields.append(("Mask blur", str(self.mask_blur)))
        if self.hires_upscaler:
            fields += [("Hires upscale", f"{self.hires_scale:g}"),
                       *([("Hires steps", str(self.hires_steps))] if self.hires_steps else []),
                       ("Hires upscaler", _quote(self.hires_upscaler))]
        return fields

    def control_fields(self) -> list[tuple[str, str]]:
        """The ControlNet as A1111's ControlNet extension writes its first unit: ``ControlNet 0: "Module: canny, Model:
        NAME [HASH], Weight: 1, Resize Mode: Just Resize, Threshold A: 100, Threshold B: 200, Guidance Start: 0,
        Guidance End: 1, Control Mode: Balanced"`` (the thresholds for canny alone); none without one."""
        return [("ControlNet 0", _quote(self.control_unit()))] if self.controlnet else []

    def control_unit(self) -> str:
        """The ControlNet unit's own text (``control_fields``' value before it is quoted)."""
        unit = [("Module", self.control_module), ("Model", f"{self.controlnet} [{self.controlnet_hash}]"),
                ("Weight", f"{self.control_weight:g}"), ("Resize Mode", "Just Resize"),
                *([("Threshold A", str(self.control_low)), ("Threshold B", str(self.control_high))]
                  if self.control_module == "canny" else []),
                ("Guidance Start", f"{self.control_start:g}"), ("Guidance End", f"{self.control_end:g}"),
                ("Control Mode", "Balanced")]
        return ", ".join(f"{k}: {v}" for k, v in unit)

    def guidance_fields(self) -> list[tuple[str, str]]:
        """The guidance as Forge writes it: "CFG scale" for classifier-free guidance; for a model that takes none,
        "CFG scale: 1" (no second pass), and its distilled scale as "Distilled CFG Scale" where it takes one."""
        if self.guidance_kind == "cfg":
            return [("CFG scale", f"{self.guidance:g}")]
        distilled = [("Distilled CFG Scale", f"{self.guidance:g}")] if self.guidance_kind == "distilled" else []
        return [("CFG scale", "1"), *distilled]

    def parameters(self) -> str:
        """The text A1111 writes (and its PNG Info tab reads): prompt, negative prompt, settings line.

        Line breaks in the prompts are written as spaces, so no prompt can add a "Negative prompt:" or a
        settings line of its own; the exact prompts are in the ``dwb`` record."""
        lines = [as_one_line(self.prompt)]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {as_one_line(self.negative_prompt)}")
        weights = {"ema": "EMA", "raw": "raw"}.get(self.weights, self.weights)
        settings = [("Steps", self.steps), ("Sampler", self.sampler), *self.guidance_fields(),
                    ("Seed", self.seed), ("Size", f"{self.width}x{self.height}"),
                    ("Model hash", self.checkpoint_hash), ("Model", _quote(self.checkpoint)),
                    *([("VAE hash", self.vae_hash), ("VAE", _quote(self.vae))] if self.vae else []),
                    ("Weights", weights), *([("Clip skip", self.clip_skip)] if self.clip_skip > 1 else []),
                    *self.mode_fields(), *self.refiner_fields(), *self.control_fields(),
                    *([("Lora hashes", _quote(self.lora_hashes))] if self.lora_hashes else []),
                    ("Version", self.software)]
        lines.append(", ".join(f"{k}: {v}" for k, v in settings))
        return "\n".join(lines)

    def pnginfo(self, extra: dict | None = None) -> dict[str, str]:
        """Text chunks: ``parameters`` (A1111) and ``dwb`` (the record as JSON, plus ``extra`` fields)."""
        return {"parameters": self.parameters(), "dwb": json.dumps({**asdict(self), **(extra or {})}, sort_keys=True)}

    @classmethod
    def from_chunk(cls, text: str) -> "ImageRecord":
        """The record a PNG's ``dwb`` text chunk holds, read as JSON from outside (``models.common.loads_outside``:
        a chunk nested 5,000 deep raised RecursionError in PNG Info); a one-line WorkbenchError for a chunk that
        is too long, too deep, not JSON or not a whole record."""
        what = "this PNG's dwb record"
        data = loads_outside(text, what, max_bytes=MAX_RECORD_CHARS)
        try:
            return cls.from_json(data)
        except ValueError as e:
            raise WorkbenchError(f"{what}: {first_line(e)}") from None

    @classmethod
    def from_json(cls, data: dict) -> "ImageRecord":
        """The record a ``dwb`` chunk holds (other keys ignored); ValueError for a missing field or one of
        another type: the chunk may come from anywhere."""
        if not isinstance(data, dict):
            raise ValueError(f"a record is a JSON object, got {type(data).__name__}")
        values = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is MISSING:
                    raise ValueError(f"the record has no {f.name}")
                continue
            value = data[f.name]
            if isinstance(value, bool) or not isinstance(value, _RECORD_TYPES[f.type]):
                raise ValueError(f"the record's {f.name} is not {f.type}")
            if f.type == "float" and abs(value) > sys.float_info.max:  # float() raised OverflowError on 10**400
                raise ValueError(f"the record's {f.name} is a number past the floats' range")
            values[f.name] = float(value) if f.type == "float" else value
        return cls(**values)


_RECORD_TYPES = {"str": str, "int": int, "float": (int, float)}  # ImageRecord's field annotations


def _modes_of(settings: Settings) -> dict:
    """The record's fields of what ``settings`` draw from besides noise (``ImageRecord.mode`` and after)."""
    init, hires = settings.init, settings.hires
    if init is not None:
        return dict(mode=init.mode, strength=init.strength, mask_blur=init.mask_blur if init.mask is not None else 0)
    if hires is not None:
        return dict(mode="txt2img", strength=hires.strength, hires_scale=hires.scale, hires_steps=hires.steps,
                    hires_upscaler=hires.upscaler)
    return {}


def _control_of(settings: Settings) -> dict:
    """The record's ControlNet fields of ``settings.control`` (``ImageRecord.controlnet`` and after)."""
    control = settings.control
    if control is None:
        return {}
    low, high = control.thresholds if control.module == "canny" else (0, 0)
    return dict(controlnet=control.name, controlnet_hash=control.hash, control_module=control.module,
                control_weight=control.weight, control_start=control.start, control_end=control.end,
                control_low=low, control_high=high)


def control_of(parsed: dict) -> dict | None:
    """The first ControlNet unit a ``parse_parameters`` dict names (A1111's, Forge's or ours: ``ControlNet 0: "Module:
    canny, Model: NAME [HASH], Weight: 1, ..."``) as the text of ``module``, ``model``, ``hash``, ``weight``,
    ``start``, ``end``, ``low`` and ``high`` where given (the caller reads them as numbers); None without one."""
    value = parsed.get("ControlNet 0") or parsed.get("ControlNet")
    if not isinstance(value, str) or not value.strip():
        return None
    unit = settings_line(value)
    names = {"module": "Module", "weight": "Weight", "start": "Guidance Start", "end": "Guidance End",
             "low": "Threshold A", "high": "Threshold B"}
    out = {key: unit[name] for key, name in names.items() if name in unit}
    model = unit.get("Model", "")
    match = REFINER_VALUE.fullmatch(model)
    out["model"], out["hash"] = (match.group(1), match.group(2).strip()) if match else (model.strip(), "")
    return out


def _loras_of(settings: Settings) -> dict:
    """The record's ``lora_hashes`` and ``lora_strengths`` of the adapters ``settings`` say were applied."""
    loras = [(name.replace(":", "").replace(",", ""), short, strength) for name, short, strength in settings.loras]
    if not loras:  # A1111 takes ":" and "," out of a name, which would split its list
        return {}
    return dict(lora_hashes=", ".join(f"{name}: {short}" for name, short, _ in loras),
                lora_strengths=", ".join(f"{name}: {strength:g}" for name, _, strength in loras))


def named_values(text: str) -> list[tuple[str, str]]:
    """``"NAME: VALUE, NAME: VALUE"`` (``Lora hashes``, ``lora_strengths``) as (name, value) pairs, in order; a name
    holds no ``,`` (A1111 takes it out) and its value follows its last ``": "``."""
    pairs = []
    for item in str(text or "").split(","):
        name, sep, value = item.rpartition(": ")
        if sep and name.strip() and value.strip():
            pairs.append((name.strip(), value.strip()))
    return pairs


def modes_of(parsed: dict) -> dict:
    """What a ``parse_parameters`` dict (A1111's, Forge's or ours) says the image was drawn from: ``mode`` ("img2img",
    "inpaint", "txt2img" with a hires fix, "" from text alone) and the text of ``strength``, ``mask_blur``,
    ``hires_scale``, ``hires_steps`` and ``hires_upscaler`` where given (the caller reads them as numbers)."""
    hires, inpaint = "Hires upscale" in parsed or "Hires upscaler" in parsed, "Mask blur" in parsed
    mode = "txt2img" if hires else "inpaint" if inpaint else "img2img" if "Denoising strength" in parsed else ""
    names = {"strength": "Denoising strength", "mask_blur": "Mask blur", "hires_scale": "Hires upscale",
             "hires_steps": "Hires steps", "hires_upscaler": "Hires upscaler"}
    return {"mode": mode, **{key: parsed[name] for key, name in names.items() if name in parsed}}


# The line breaks a prompt may hold that CLIP's tokenizer reads as one space, like every run of whitespace
# (the same token ids with either, for SD2's tokenizer and the tiny one: tests/app/test_generate.py). Other
# characters some readers take for line breaks (U+0085, form feed) are tokens to CLIP and stay.
LINE_BREAKS = re.compile("[\r\n\u2028\u2029]+")


def as_one_line(prompt: str) -> str:
    """A prompt for the ``parameters`` text: line breaks as spaces (the same image; see LINE_BREAKS)."""
    return LINE_BREAKS.sub(" ", prompt)


def _quote(value: str) -> str:
    return json.dumps(value) if re.search(r'[,:"]', value) or LINE_BREAKS.search(value) else value


def with_metadata(image: Image.Image, record: ImageRecord) -> Image.Image:
    """The image with its record in ``image.info``; PNG writers (ours and Gradio's) keep text chunks."""
    image.info.update(record.pnginfo())
    return image


def save_png(image: Image.Image, path, record: ImageRecord, extra: dict | None = None) -> None:
    """The PNG with its record as text chunks, written whole or not at all (``models.common.files``)."""
    from ..common import whole_file

    info = PngImagePlugin.PngInfo()
    for key, value in record.pnginfo(extra).items():
        info.add_text(key, value)
    with whole_file(path) as tmp:
        image.save(tmp, format="PNG", pnginfo=info)


# Where an image's parameters go, by the format its name asks for: PNG text chunks, or EXIF UserComment in a JPEG
# or WebP, as AUTOMATIC1111 writes them (``piexif.helper.UserComment``, UTF-16 "unicode"). Other formats carry no
# text A1111 or we read back, so they are refused before any image is made.
SUFFIX_FORMATS = {".png": "PNG", "": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}  # no suffix: a PNG
JPEG_QUALITY = 95  # PIL's default of 75 blurs the tiny models' pixel-enlarged cells; A1111's default is 80


def image_format(path) -> str:
    """"PNG", "JPEG" or "WEBP" for an output's name; a one-line WorkbenchError for another suffix."""
    from pathlib import Path

    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        raise WorkbenchError(f"{Path(path).name}: images are written as .png, .jpg or .webp, which carry their "
                             f"generation parameters; a {suffix} file would not")
    return SUFFIX_FORMATS[suffix]


def exif_parameters(text: str) -> bytes:
    """EXIF holding ``text`` as its UserComment, as AUTOMATIC1111 writes a JPEG's or WebP's parameters."""
    import piexif
    import piexif.helper

    return piexif.dump({"Exif": {piexif.ExifIFD.UserComment: piexif.helper.UserComment.dump(text, encoding="unicode")}})


def parameters_from_exif(exif: bytes) -> str | None:
    """The UserComment of an image's EXIF (a JPEG's or WebP's parameters, A1111's or ours); None where it has
    none or the EXIF does not read."""
    import piexif
    import piexif.helper

    try:
        comment = piexif.load(exif).get("Exif", {}).get(piexif.ExifIFD.UserComment)
        return piexif.helper.UserComment.load(comment) if comment else None
    except Exception:  # noqa: BLE001 - EXIF from anywhere: piexif raises many kinds on damaged data
        return None


def save_image(image: Image.Image, path, record: ImageRecord, extra: dict | None = None) -> None:
    """The image with its record, in the format its name asks for (``image_format``), written whole or not at
    all: a PNG's text chunks (``save_png``), or a JPEG's or WebP's EXIF UserComment (the ``parameters`` text)."""
    from ..common import whole_file

    fmt = image_format(path)
    if fmt == "PNG":
        save_png(image, path, record, extra)
        return
    with whole_file(path) as tmp:
        image.convert("RGB").save(tmp, format=fmt, quality=JPEG_QUALITY, exif=exif_parameters(record.parameters()))


REFINER_VALUE = re.compile(r"(.*\S)\s*\[([^\[\]]*)\]\s*")  # "NAME [HASH]"


def refiner_of(parsed: dict) -> tuple[str, str, float | None] | None:
    """(name, hash, switch) of the refiner a ``parse_parameters`` dict names (A1111's, Forge's or ours: "Refiner:
    NAME [HASH], Refiner switch at: 0.8"); the switch None where it is missing or not a fraction in (0, 1); None
    where there was no refiner."""
    value = parsed.get("Refiner", "")
    if not isinstance(value, str) or not value.strip():
        return None
    match = REFINER_VALUE.fullmatch(value)
    name, digest = (match.group(1), match.group(2).strip()) if match else (value.strip(), "")
    try:
        switch = float(parsed.get("Refiner switch at", ""))
    except (TypeError, ValueError):
        switch = None
    return name, digest, switch if switch is not None and 0 < switch < 1 else None


def parse_parameters(text: str) -> dict[str, str]:
    """A1111 ``parameters`` text back to a dict: prompt, negative prompt and each ``Key: value``."""
    lines = text.split("\n")
    out: dict[str, str] = {}
    body = lines[:-1]
    negative = [i for i, line in enumerate(body) if line.startswith("Negative prompt: ")]
    if negative:
        out["prompt"] = "\n".join(body[:negative[0]])
        out["negative_prompt"] = "\n".join(body[negative[0]:]).removeprefix("Negative prompt: ")
    else:
        out["prompt"] = "\n".join(body)
        out["negative_prompt"] = ""
    out.update(settings_line(lines[-1]))
    return out


def settings_line(line: str) -> dict[str, str]:
    """``Key: value, Key: "a JSON string, with commas", ...`` read left to right, in time linear in its length.

    A key is the run of word characters and spaces before a ':'; a value is a JSON-quoted string followed by
    ',' or the end, else everything up to the next ','. (A backtracking pattern for the same took 54 s on a
    line of 2,400 spaces, holding the GIL: every request to the app waited.)
    """
    out: dict[str, str] = {}
    pos, end = 0, len(line)
    while pos < end:
        colon = line.find(":", pos)
        if colon < 0:
            break
        key = _key_before(line, pos, colon)
        value, pos = _value_at(line, colon + 1)
        if key:
            out[key] = value
    return out


def _key_before(line: str, start: int, colon: int) -> str:
    """The word characters and spaces that end at ``colon`` (what is before them in the segment is not the key)."""
    i = colon
    while i > start and (line[i - 1].isalnum() or line[i - 1] in "_ "):
        i -= 1
    return line[i:colon].strip()


def _value_at(line: str, pos: int) -> tuple[str, int]:
    """(the value starting at ``pos``, where the next key starts)."""
    while pos < len(line) and line[pos].isspace():
        pos += 1
    if line.startswith('"', pos):
        closing = _closing_quote(line, pos)
        after = closing + 1
        while 0 < after < len(line) and line[after] == " ":
            after += 1
        if closing > 0 and (after == len(line) or line[after] == ","):
            try:
                return json.loads(line[pos:closing + 1]), after + 1
            except ValueError:
                pass  # not JSON after all: read it as plain text below
    comma = line.find(",", pos)
    comma = len(line) if comma < 0 else comma
    return line[pos:comma].strip(), comma + 1


def _closing_quote(line: str, opening: int) -> int:
    """The index of the quote that closes the JSON string opened at ``opening`` (-1 if none); each character is
    looked at once: the scan stops at the first quote that no backslash escapes."""
    i = opening + 1
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i
        else:
            i += 1
    return -1
