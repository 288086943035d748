"""Sample sets: the images a study compares, read from `evaluate`'s manifests or from image folders.

Both readers return the same thing, a list of `Sample`, so a study can mix them.

*Manifest* (JSONL, one object per image, written by `dwb evaluate`): ``prompt``, ``image_index`` and
``path`` (relative to the manifest's folder, or absolute) are required, plus ``model`` or
``checkpoint`` (the model's label defaults to the checkpoint's file stem). ``prompt_index``,
``category``, ``seed``, ``guidance``, ``scheduler``, ``steps``, ``width`` and ``height`` are kept when
present; any other key is ignored.

*Folder*: one folder of images per model plus a CSV of prompts. The CSV has a header with a ``prompt``
column and optionally a ``category`` column (DrawBench's ``prompt,category`` and PartiPrompts'
``Prompt,Category`` both work). Images are named ``<prompt_index>_<image_index>.<ext>``, where
``prompt_index`` is the 0-based data row of the CSV and ``image_index`` numbers the images of one prompt
(``0_0.png``, ``0_1.png``, ``17_0.jpg``; leading zeros allowed); ``.png``, ``.jpg``, ``.jpeg`` and
``.webp`` are read, other files are ignored. The model's label is the folder's name.
"""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import HumanEvalError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
FOLDER_NAME = re.compile(r"^(\d+)_(\d+)$")
SETTINGS = ("guidance", "scheduler", "steps", "width", "height")


@dataclass(frozen=True)
class Sample:
    """One generated image and what it was generated from."""

    model: str
    prompt: str
    image_index: int
    path: Path
    prompt_index: int | None = None
    category: str = ""
    seed: int | None = None
    checkpoint: str = ""
    source: str = ""  # the manifest or folder it came from (admin-side only)
    settings: dict = field(default_factory=dict, compare=False)  # guidance, scheduler, steps, width, height

    @property
    def key(self) -> tuple[str, int]:
        """What pairs two models' images: the same prompt and the same per-prompt image number."""
        return (self.prompt, self.image_index)


def _int(value, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HumanEvalError(f"{where}: '{what}' must be an integer, got {value!r}")
    return value


def read_manifest(path: str | Path, model: str | None = None) -> list[Sample]:
    """Samples of one JSONL manifest; `model` overrides every line's label."""
    path = Path(path)
    if not path.is_file():
        raise HumanEvalError(f"manifest not found: {path}")
    samples, seen = [], set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise HumanEvalError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise HumanEvalError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in ("prompt", "image_index", "path"):
                if key not in row:
                    raise HumanEvalError(f"{where}: missing key '{key}'")
            prompt = row["prompt"]
            if not isinstance(prompt, str) or not prompt.strip():
                raise HumanEvalError(f"{where}: 'prompt' must be a non-empty string")
            checkpoint = str(row.get("checkpoint") or "")
            label = model or row.get("model") or (Path(checkpoint).stem if checkpoint else "")
            if not isinstance(label, str) or not label:
                raise HumanEvalError(f"{where}: needs 'model' or 'checkpoint' to tell which model made the image")
            image_path = Path(str(row["path"]))
            image_path = image_path if image_path.is_absolute() else path.parent / image_path
            if not image_path.is_file():
                raise HumanEvalError(f"{where}: image not found: {image_path}")
            sample = Sample(
                model=label, prompt=prompt.strip(), image_index=_int(row["image_index"], "image_index", where),
                path=image_path,
                prompt_index=_int(row["prompt_index"], "prompt_index", where) if row.get("prompt_index") is not None else None,
                category=str(row.get("category") or ""),
                seed=_int(row["seed"], "seed", where) if row.get("seed") is not None else None,
                checkpoint=checkpoint, source=str(path), settings={k: row[k] for k in SETTINGS if k in row},
            )
            if (sample.model, *sample.key) in seen:
                raise HumanEvalError(f"{where}: a second image of model '{label}' for the same prompt and image_index "
                                     f"{sample.image_index}")
            seen.add((sample.model, *sample.key))
            samples.append(sample)
    if not samples:
        raise HumanEvalError(f"manifest is empty: {path}")
    return samples


def read_prompts_csv(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, category) per data row of a prompt CSV with a `prompt` column and an optional `category`."""
    path = Path(path)
    if not path.is_file():
        raise HumanEvalError(f"prompt CSV not found: {path}")
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        columns = {name.strip().lower(): name for name in reader.fieldnames or []}
        if "prompt" not in columns:
            raise HumanEvalError(f"{path}: needs a 'prompt' column (found: {', '.join(reader.fieldnames or []) or 'none'})")
        rows = [((row[columns["prompt"]] or "").strip(), (row.get(columns.get("category", ""), "") or "").strip())
                for row in reader]
    for i, (prompt, _) in enumerate(rows):
        if not prompt:
            raise HumanEvalError(f"{path}: data row {i} has an empty prompt")
    if not rows:
        raise HumanEvalError(f"{path}: no prompts")
    return rows


def read_folder(folder: str | Path, prompts_csv: str | Path, model: str | None = None) -> list[Sample]:
    """Samples of one model's image folder named `<prompt_index>_<image_index>.<ext>` (see the module doc)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HumanEvalError(f"image folder not found: {folder}")
    prompts = read_prompts_csv(prompts_csv)
    label = model or folder.resolve().name
    samples, seen = [], {}
    for image in sorted(folder.iterdir()):
        match = FOLDER_NAME.match(image.stem)
        if image.suffix.lower() not in IMAGE_SUFFIXES or not match or not image.is_file():
            continue
        prompt_index, image_index = int(match.group(1)), int(match.group(2))
        if prompt_index >= len(prompts):
            raise HumanEvalError(f"{image}: prompt index {prompt_index} is past the {len(prompts)} prompts of {prompts_csv}")
        if (prompt_index, image_index) in seen:
            raise HumanEvalError(f"{image}: a second image for prompt {prompt_index}, image {image_index} "
                                 f"(also {seen[prompt_index, image_index].name})")
        seen[prompt_index, image_index] = image
        prompt, category = prompts[prompt_index]
        samples.append(Sample(model=label, prompt=prompt, image_index=image_index, path=image,
                              prompt_index=prompt_index, category=category, source=str(folder)))
    if not samples:
        raise HumanEvalError(f"no images named <prompt_index>_<image_index>.png/.jpg/.webp in {folder}")
    return samples
