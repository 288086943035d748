"""Tokenizers from files a checkpoint carries, opened without writing outside a private folder or running code.

A Composer checkpoint's spec carries its tokenizer as ``{file name: text}``; a diffusers folder has a
``tokenizer/`` folder and a ``model_index.json`` naming each part's library. Each could be hostile:

- a spec's file names are written to disk: only the names a CLIP tokenizer uses are accepted (a name
  like ``../../x.pth`` would otherwise be written where it says; a ``.pth`` file in site-packages runs at
  the next interpreter start);
- a ``tokenizer_config.json`` may name files to read (``vocab_file``, ``merges_file``, ``tokenizer_file``):
  only plain names inside its own folder are accepted; ``auto_map`` (remote code) is refused;
- a ``model_index.json`` makes diffusers import each part's library by name: only ``diffusers`` and
  ``transformers`` are accepted.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..common import load_outside, loads_outside
from ..errors import CheckpointError, WorkbenchError

TOKENIZER_FILES = frozenset({"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json",
                             "added_tokens.json", "tokenizer.json"})
FILE_KEYS = ("vocab_file", "merges_file", "tokenizer_file", "added_tokens_file", "special_tokens_map_file")
LIBRARIES = frozenset({"diffusers", "transformers"})


def _check_config(config: dict, where: str) -> None:
    if "auto_map" in config:
        raise CheckpointError(f"{where}: its tokenizer config asks for custom code (auto_map); refused")
    for key in FILE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or Path(value).name != value or value in ("", ".", ".."):
            raise CheckpointError(f"{where}: its tokenizer config points {key} outside its folder ({value!r}); refused")


def _check_files(files: dict, where: str) -> None:
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: its tokenizer files are not a mapping of names to text")
    for name, text in files.items():
        if name not in TOKENIZER_FILES or not isinstance(text, str):
            raise CheckpointError(f"{where}: its spec holds a tokenizer file named {name!r}, not one of "
                                  f"{', '.join(sorted(TOKENIZER_FILES))}; refused")
    if "tokenizer_config.json" in files:
        try:
            config = loads_outside(files["tokenizer_config.json"], "its tokenizer_config.json")
        except WorkbenchError as e:
            raise CheckpointError(f"{where}: {e}") from None
        _check_config(config if isinstance(config, dict) else {}, where)


def tokenizer_from_files(files: dict, where: str, cls=None):
    """A tokenizer of class ``cls`` (CLIPTokenizer unless given; T5TokenizerFast for Flux.1's T5) from a spec's
    ``{name: text}`` files, checked, via a private temporary folder."""
    from transformers import CLIPTokenizer

    cls = cls or CLIPTokenizer
    if not files:
        return None
    _check_files(files, where)
    with tempfile.TemporaryDirectory(prefix="dwb-tokenizer-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        try:
            return cls.from_pretrained(tmp, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - a foreign file's tokenizer
            raise CheckpointError(f"{where}: its tokenizer does not load ({type(e).__name__}: {e})") from None


def check_pipeline_folder(folder: Path, where: str) -> None:
    """A diffusers folder's ``model_index.json`` and ``tokenizer/`` are safe to hand to diffusers."""
    try:
        index = load_outside(folder / "model_index.json")
    except WorkbenchError as e:
        raise CheckpointError(f"{where}: {e}") from None
    for part, value in (index.items() if isinstance(index, dict) else []):
        if part.startswith("_") or not isinstance(value, list):
            continue  # settings such as requires_safety_checker; parts are [library, class]
        if len(value) != 2 or (value[0] is not None and value[0] not in LIBRARIES):
            raise CheckpointError(f"{where}: model_index.json names {value!r} for '{part}'; only diffusers and "
                                  "transformers parts are opened")
    for config in sorted(folder.glob("tokenizer*/tokenizer_config.json")):  # SDXL's, SD3's and Flux.1's second
        try:                                                                # and third tokenizers too
            data = load_outside(config, f"{config.parent.name}/tokenizer_config.json")
        except WorkbenchError as e:
            raise CheckpointError(f"{where}: {e}") from None
        _check_config(data if isinstance(data, dict) else {}, where)
