"""PNG parameters: the one record of how an image was made, written into its PNG and read back.

``ImageRecord`` is what makes an image again: written into its PNG as AUTOMATIC1111's ``parameters`` text
(which image viewers and A1111's PNG Info read) and as JSON (``dwb``), and read back by ``parse_parameters``
from ours and A1111's.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields

from PIL import Image, PngImagePlugin

from .images import Settings


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
    checkpoint_hash: str  # train.checkpoints.content_hash
    weights: str  # "ema" or "raw" (a Composer checkpoint), "stored" (the one set a file holds)
    software: str = field(default="diffusion-workbench")

    @classmethod
    def of(cls, settings: Settings, prompt: str, seed: int, size: tuple[int, int], sampler: str, checkpoint: str,
           checkpoint_hash: str, weights: str) -> "ImageRecord":
        return cls(prompt, settings.negative_prompt, sampler, settings.steps, float(settings.guidance), size[0],
                   size[1], int(seed), checkpoint, checkpoint_hash, weights)

    def parameters(self) -> str:
        """The text A1111 writes (and its PNG Info tab reads): prompt, negative prompt, settings line."""
        lines = [self.prompt]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {self.negative_prompt}")
        weights = {"ema": "EMA", "raw": "raw"}.get(self.weights, self.weights)
        settings = [("Steps", self.steps), ("Sampler", self.sampler), ("CFG scale", f"{self.guidance:g}"),
                    ("Seed", self.seed), ("Size", f"{self.width}x{self.height}"),
                    ("Model hash", self.checkpoint_hash), ("Model", _quote(self.checkpoint)),
                    ("Weights", weights), ("Version", self.software)]
        lines.append(", ".join(f"{k}: {v}" for k, v in settings))
        return "\n".join(lines)

    def pnginfo(self, extra: dict | None = None) -> dict[str, str]:
        """Text chunks: ``parameters`` (A1111) and ``dwb`` (the record as JSON, plus ``extra`` fields)."""
        return {"parameters": self.parameters(), "dwb": json.dumps({**asdict(self), **(extra or {})}, sort_keys=True)}

    @classmethod
    def from_json(cls, data: dict) -> "ImageRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _quote(value: str) -> str:
    return json.dumps(value) if re.search(r'[,:"\n]', value) else value


def with_metadata(image: Image.Image, record: ImageRecord) -> Image.Image:
    """The image with its record in ``image.info``; PNG writers (ours and Gradio's) keep text chunks."""
    image.info.update(record.pnginfo())
    return image


def save_png(image: Image.Image, path, record: ImageRecord, extra: dict | None = None) -> None:
    """The PNG with its record as text chunks, written whole or not at all (``train.files``)."""
    from ..files import whole_file

    info = PngImagePlugin.PngInfo()
    for key, value in record.pnginfo(extra).items():
        info.add_text(key, value)
    with whole_file(path) as tmp:
        image.save(tmp, format="PNG", pnginfo=info)


def parse_parameters(text: str) -> dict[str, str]:
    """A1111 ``parameters`` text back to a dict: prompt, negative prompt and each ``Key: value``."""
    lines = text.split("\n")
    settings = lines[-1]
    out: dict[str, str] = {}
    body = lines[:-1]
    negative = [i for i, line in enumerate(body) if line.startswith("Negative prompt: ")]
    if negative:
        out["prompt"] = "\n".join(body[:negative[0]])
        out["negative_prompt"] = "\n".join(body[negative[0]:]).removeprefix("Negative prompt: ")
    else:
        out["prompt"] = "\n".join(body)
        out["negative_prompt"] = ""
    for m in re.finditer(r'\s*([\w ]+):\s*("(?:\\.|[^\\"])*"|[^,]*)(?:,|$)', settings):
        key, value = m.group(1).strip(), m.group(2).strip()
        out[key] = json.loads(value) if value.startswith('"') else value
    return out
