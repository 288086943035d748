"""Sample sets: the images a study compares, read from `evaluate`'s manifests or from image folders.

Both readers return the same thing, a list of `Sample`, so a study can mix them.

*Manifest* (JSONL, one object per image, written by `dwb evaluate`): ``prompt``, ``image_index`` and
``path`` (relative to the manifest's folder, or absolute) are required, plus ``model`` or
``checkpoint`` (the model's label defaults to the checkpoint's file stem). ``prompt_set``,
``prompt_index``, ``category``, ``seed``, ``guidance``, ``sampler``, ``steps``, ``width``, ``height``,
``checkpoint_hash`` and the per-image metrics (``METRICS``) are kept when present; any
other key is ignored. Manifests written before ``sampler`` was named so say ``scheduler``: read as ``sampler``.

*Prompt identity*: a prompt is its place in a prompt list, not its text. Two images show the same
prompt when they carry the same ``prompt_set`` (a hash of the list, `prompt_set_id`) and the same
``prompt_index``; a caption that appears twice in a list is two prompts. Without ``prompt_index`` the
caption text is all there is to go by.

*Folder*: one folder of images per model plus its prompts: ``drawbench`` or ``parti`` (the sets the workbench
ships), or a CSV/TSV with a prompt column and optionally a ``category`` column (DrawBench's
``prompt,category`` and PartiPrompts' ``Prompt<TAB>Category`` both work). Images are named
``<prompt_index>_<image_index>.<ext>``, where ``prompt_index`` is the 0-based place of the prompt in the
table and ``image_index`` numbers the images of one prompt
(``0_0.png``, ``0_1.png``, ``17_0.jpg``; leading zeros allowed); ``.png``, ``.jpg``, ``.jpeg`` and
``.webp`` are read, other files are ignored. The model's label is the folder's name. The table's rows are
the prompts' identity: its ``prompt_set`` is `prompt_set_id` of its prompt column.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from models.common import loads_outside
from models.errors import WorkbenchError

from .errors import HumanEvalError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
FOLDER_NAME = re.compile(r"^(\d+)_(\d+)$")
SETTINGS = ("guidance", "sampler", "steps", "width", "height")
# Manifests, results rows and studies written before the sampler had one name call it "scheduler".
OLD_SAMPLER_KEY = "scheduler"
# per-image automated scores, kept for joining with human results: CLIP score, attribute verdict, and the
# human-preference scores (evaluate/scorers/preference.py: PickScore, HPSv2.1, ImageReward, aesthetic)
METRICS = ("clip_score", "attr_all", "pickscore", "hps", "imagereward", "aesthetic")


def prompt_set_id(texts: list[str]) -> str:
    """The identity of a prompt list: SHA-256 of its texts in order as a JSON array, first 16 hex digits.

    `evaluate` writes the same value into every manifest line (``prompt_set``), so a folder of images made
    from a prompt CSV pairs with evaluate's samples of that CSV.
    """
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]


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
    settings: dict = field(default_factory=dict, compare=False)  # guidance, sampler, steps, width, height
    prompt_set: str = ""
    checkpoint_hash: str = ""
    metrics: dict = field(default_factory=dict, compare=False)  # clip_score, attr_all where the manifest has them

    @property
    def prompt_id(self) -> tuple[str, int | None, str]:
        """Which prompt: (prompt set, prompt index), or the caption alone where there is no prompt index."""
        return (self.prompt_set, self.prompt_index, "" if self.prompt_index is not None else self.prompt)

    @property
    def key(self) -> tuple[tuple[str, int | None, str], int]:
        """What pairs two models' images: the same prompt and the same per-prompt image number."""
        return (self.prompt_id, self.image_index)

    def describe(self) -> str:
        """The prompt for messages: its index and text."""
        return f"prompt {self.prompt_index} ({self.prompt!r})" if self.prompt_index is not None else repr(self.prompt)


def with_sampler_key(record: dict) -> dict:
    """``record`` (a manifest line, a results row, a study's model info) with an older file's ``scheduler`` key
    read as ``sampler``."""
    if OLD_SAMPLER_KEY in record and "sampler" not in record:
        record["sampler"] = record.pop(OLD_SAMPLER_KEY)
    return record


def _int(value, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HumanEvalError(f"{where}: '{what}' must be an integer, got {value!r}")
    return value


def _optional_int(row: dict, key: str, where: str) -> int | None:
    return _int(row[key], key, where) if row.get(key) is not None else None


def _check_settings(row: dict, where: str) -> None:
    """The settings a study keeps per model (``SETTINGS``): guidance a number, sampler text, the rest integers."""
    for key in SETTINGS:
        value = row.get(key)
        kind = (int, float) if key == "guidance" else str if key == "sampler" else int
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise HumanEvalError(f"{where}: '{key}' must be {'text' if kind is str else 'a number'}, got "
                                 f"{str(value)[:80]!r}")


def _sample_of_line(row, where: str, manifest: Path, model: str | None) -> Sample:
    """One manifest line as a Sample, or a one-line error naming the line and the key."""
    if not isinstance(row, dict):
        raise HumanEvalError(f"{where}: expected a JSON object, got {type(row).__name__}")
    row = with_sampler_key(row)
    for key in ("prompt", "image_index", "path"):
        if key not in row:
            raise HumanEvalError(f"{where}: missing key '{key}'")
    prompt = row["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise HumanEvalError(f"{where}: 'prompt' must be a non-empty string")
    if not isinstance(row.get("prompt_set") or "", str):
        raise HumanEvalError(f"{where}: 'prompt_set' must be a string")
    checkpoint = str(row.get("checkpoint") or "")
    label = model or row.get("model") or (Path(checkpoint).stem if checkpoint else "")
    if not isinstance(label, str) or not label:
        raise HumanEvalError(f"{where}: needs 'model' or 'checkpoint' to tell which model made the image")
    image_path = Path(str(row["path"]))
    image_path = image_path if image_path.is_absolute() else manifest.parent / image_path
    if not image_path.is_file():
        raise HumanEvalError(f"{where}: image not found: {image_path}")
    _check_settings(row, where)
    # clip_score is a number; attr_all is evaluate's verdict, true / false (1 / 0 here) or null (does not count)
    metrics = {k: float(row[k]) for k in METRICS if isinstance(row.get(k), (int, float)) and math.isfinite(row[k])}
    return Sample(
        model=label, prompt=prompt.strip(), image_index=_int(row["image_index"], "image_index", where), path=image_path,
        prompt_index=_optional_int(row, "prompt_index", where), category=str(row.get("category") or ""),
        seed=_optional_int(row, "seed", where), checkpoint=checkpoint, source=str(manifest),
        settings={k: row[k] for k in SETTINGS if k in row}, prompt_set=row.get("prompt_set") or "",
        checkpoint_hash=str(row.get("checkpoint_hash") or ""), metrics=metrics)


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
                row = loads_outside(line, where)
            except WorkbenchError as e:
                raise HumanEvalError(str(e)) from None
            sample = _sample_of_line(row, where, path, model)
            if (sample.model, sample.key) in seen:
                hint = "" if sample.prompt_index is not None else " (a 'prompt_index' per line tells repeated captions apart)"
                raise HumanEvalError(f"{where}: a second image of model '{sample.model}' for {sample.describe()} and "
                                     f"image_index {sample.image_index}{hint}")
            seen.add((sample.model, sample.key))
            samples.append(sample)
    if not samples:
        raise HumanEvalError(f"manifest is empty: {path}")
    return samples


def named_as_entry(samples: list[Sample], text: str) -> list[Sample]:
    """Samples of one model given as an entry, ``BASE + FILE@S`` (``models.checkpoints``, as `dwb evaluate run` and
    `compare` take it): named and hashed as the entry (``BASE_LABEL + stem@S``, the base's content hash and each
    file's AUTOMATIC1111 short hash), so votes join evaluate's rows of that entry. Where a manifest line names
    another model's hash, its images are another model's: refused in one line."""
    from models.checkpoints import find_entry

    entry = find_entry(text)
    digest = entry.hash()
    for s in samples:
        if s.checkpoint_hash and s.checkpoint_hash != digest:
            raise HumanEvalError(f"{s.source}: its images were drawn by the model with hash {s.checkpoint_hash}, not "
                                 f"by {entry.label} ({digest})")
    return [replace(s, model=entry.label, checkpoint=entry.ref, checkpoint_hash=digest) for s in samples]


def read_prompts(name_or_path: str | Path) -> list[tuple[str, str]]:
    """(prompt, category) per prompt of a shipped set (``drawbench``, ``parti``) or a CSV/TSV prompt table: the
    workbench's one table reader (``models.generation.read_prompt_table``)."""
    from models.generation import read_prompt_table  # a CSV reader; the face loads nothing else

    return [(p.text, p.category if p.category != "uncategorised" else "") for p in read_prompt_table(name_or_path)]


def read_folder(folder: str | Path, prompts: str | Path, model: str | None = None) -> list[Sample]:
    """Samples of one model's image folder named `<prompt_index>_<image_index>.<ext>` (see the module doc)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HumanEvalError(f"image folder not found: {folder}")
    table = read_prompts(prompts)
    prompt_set = prompt_set_id([text for text, _ in table])
    label = model or folder.resolve().name
    samples, seen = [], {}
    for image in sorted(folder.iterdir()):
        match = FOLDER_NAME.match(image.stem)
        if image.suffix.lower() not in IMAGE_SUFFIXES or not match or not image.is_file():
            continue
        prompt_index, image_index = int(match.group(1)), int(match.group(2))
        if prompt_index >= len(table):
            raise HumanEvalError(f"{image}: prompt index {prompt_index} is past the {len(table)} prompts of {prompts}")
        if (prompt_index, image_index) in seen:
            raise HumanEvalError(f"{image}: a second image for prompt {prompt_index}, image {image_index} "
                                 f"(also {seen[prompt_index, image_index].name})")
        seen[prompt_index, image_index] = image
        prompt, category = table[prompt_index]
        samples.append(Sample(model=label, prompt=prompt, image_index=image_index, path=image,
                              prompt_index=prompt_index, category=category, source=str(folder), prompt_set=prompt_set))
    if not samples:
        raise HumanEvalError(f"no images named <prompt_index>_<image_index>.png/.jpg/.webp in {folder}")
    return samples
