"""JSON from outside, read with a bound on its size and nesting.

Python's ``json`` parser recurses once per level: a safetensors header, a caption sidecar, a ``results.jsonl``
line or a PNG chunk nested 5,000 deep raised ``RecursionError``, which no handler caught, and the app would not
start while such a file sat among its checkpoints. Every reader of JSON that a checkpoint, a dataset, a rater
or another process wrote calls ``loads_outside`` (or ``load_outside``): a file too large or too deep is a
``WorkbenchError`` naming it, before the parser runs. Callers that go over many files skip the one with its
reason and go on.

The parser itself stops at Python's recursion limit with ``RecursionError``, which is taken as "too deep";
what it returns is then walked without recursion and refused past ``MAX_DEPTH``, so no caller that walks
the value recursively meets a deep one either. (A scan for brackets outside strings before parsing was
tried: a regular expression for strings goes quadratic on ``"\"\"\"...`` left open.)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError

MAX_DEPTH = 64  # the deepest real file we read (a diffusers config, a results row) nests 4 levels
MAX_BYTES = 16 * 1024 * 1024  # index.json of a million-sample dataset is about 2 MiB


def nesting_depth(value: Any, stop_above: int = MAX_DEPTH) -> int:
    """How deep ``value``'s lists and dicts nest (a scalar is 0), walked without recursion; stops once
    past ``stop_above``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_above:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def loads_outside(text: str | bytes, what: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """``text`` parsed as JSON, or a one-line WorkbenchError starting with ``what`` (say which file or field)
    when it is over ``max_bytes``, nests deeper than ``max_depth`` or is not JSON."""
    if len(text) > max_bytes:
        raise WorkbenchError(f"{what}: {len(text):,} bytes of JSON, over the limit of {max_bytes:,}")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise WorkbenchError(f"{what}: not UTF-8 text") from None
    too_deep = WorkbenchError(f"{what}: JSON nested deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep from None
    except ValueError as e:
        if not isinstance(e, json.JSONDecodeError):  # int() of a number past Python's limit: its text names a setting
            raise WorkbenchError(f"{what}: holds a number of more than {sys.get_int_max_str_digits():,} digits, "
                                 f"Python's limit on reading one") from None
        raise WorkbenchError(f"{what}: not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if nesting_depth(value, max_depth) > max_depth:
        raise too_deep
    return value


def load_outside(path: str | Path, what: str | None = None, max_bytes: int = MAX_BYTES,
                 max_depth: int = MAX_DEPTH) -> Any:
    """A JSON file from outside (see ``loads_outside``); its size is checked before it is read."""
    path = Path(path)
    what = what or path.name
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise WorkbenchError(f"{what}: {size:,} bytes of JSON, over the limit of {max_bytes:,}")
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise WorkbenchError(f"{what}: cannot be read ({e.strerror or type(e).__name__})") from None
    return loads_outside(data, what, max_bytes, max_depth)
