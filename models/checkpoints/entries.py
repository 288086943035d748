"""An entry: a checkpoint, or a checkpoint with adapter files applied at a strength each, as one thing to score,
compare and study.

Spelled ``BASE + LORA@S`` on the command line (``"runs/base/checkpoints/ep1-ba400-rank0.pt + style.safetensors@0.8"``,
quoted as one argument): the base as any checkpoint is given, then, for each adapter, `` + `` (a plus between
spaces) and the file, with ``@STRENGTH`` (default 1, within ``models.generation.MAX_STRENGTH``). A space on each side
of the plus keeps it apart from a ``+`` inside a file name (``sd+ft.safetensors``), and ``@`` splits only before a
number at the end, so a path holding ``@`` elsewhere reads whole.

An entry is named and hashed as AUTOMATIC1111 records it: the base's name and content hash (its ``Model`` and
``Model hash``) and each adapter's file stem and short hash (``Lora hashes: "style: 1a2b3c4d5e6f"``, the sha256 of
the bytes after the safetensors header). Its label is ``BASE_LABEL + style@0.8`` and its hash
``BASE_HASH+1a2b3c4d5e6f@0.8``, so the same base with another file or strength is another entry, and the base
alone is the entry without adapters (its own label and hash).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import WorkbenchError
from ..generation import MAX_STRENGTH
from .names import Checkpoint

# what parsing needs loads in milliseconds (`dwb human-eval create` and `compare` name entries without torch); the
# door and the adapters are imported where an entry is found or opened
ENTRY_SEPARATOR = " + "
_STRENGTH = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)")


@dataclass(frozen=True)
class EntryAdapter:
    """One adapter file of an entry: its path, strength, and AUTOMATIC1111's name (the stem) and short hash."""

    path: Path
    strength: float
    name: str
    hash: str


@dataclass(frozen=True)
class Entry:
    """A found checkpoint (``base``) and the adapters applied to it, in order (none: the checkpoint alone)."""

    base: Checkpoint
    adapters: tuple[EntryAdapter, ...] = ()

    @property
    def ref(self) -> str:
        """The entry as written on the command line: the base's reference, then `` + FILE@S`` per adapter."""
        return entry_ref(self.base.ref, [(a.path, a.strength) for a in self.adapters])

    @property
    def label(self) -> str:
        """``BASE_LABEL + style@0.8``: the base's label and each adapter's stem at its strength."""
        return ENTRY_SEPARATOR.join([self.base.label, *(f"{a.name}@{a.strength:g}" for a in self.adapters)])

    def hash(self) -> str:
        """``BASE_HASH+ADAPTER_HASH@S...``: the base's content hash, then each adapter's short hash and strength."""
        from .hashing import content_hash

        return content_hash(self.base) + "".join(f"+{a.hash}@{a.strength:g}" for a in self.adapters)

    def a1111(self) -> dict:
        """The entry as AUTOMATIC1111's parameters name it: ``base_model`` and ``base_hash`` (its ``Model`` and
        ``Model hash``), ``lora_hashes`` ("style: 1a2b3c4d5e6f") and ``lora_strengths`` ("style: 0.8"); {} for a
        checkpoint alone."""
        from .hashing import content_hash

        if not self.adapters:
            return {}
        return {"base_model": self.base.label, "base_hash": content_hash(self.base),
                "lora_hashes": ", ".join(f"{_a1111_name(a.name)}: {a.hash}" for a in self.adapters),
                "lora_strengths": ", ".join(f"{_a1111_name(a.name)}: {a.strength:g}" for a in self.adapters)}

    def columns(self) -> dict:
        """A results row's record of what the entry is made of: the base's reference and hash, and the adapters as
        AUTOMATIC1111 writes them; {} for a checkpoint alone."""
        named = self.a1111()
        return {"base_checkpoint": self.base.ref, **{k: v for k, v in named.items() if k != "base_model"}} \
            if named else {}


def entry_ref(base: str, adapters) -> str:
    """``BASE + FILE@S ...`` as an entry's rows record it: every strength written (``@1`` where none was given)."""
    return ENTRY_SEPARATOR.join([str(base), *(f"{path}@{strength:g}" for path, strength in adapters)])


def _a1111_name(stem: str) -> str:
    """A name as AUTOMATIC1111's list keeps it: without the ":" and "," that would split the list."""
    return stem.replace(":", "").replace(",", "")


def parse_entry(text: str | Path) -> tuple[str, list[tuple[Path, float]]]:
    """``BASE + FILE@S + ...`` -> (base reference, [(file, strength), ...]); a plain reference has no adapters."""
    parts = [p.strip() for p in str(text).split(ENTRY_SEPARATOR)]
    if any(not p for p in parts):
        raise WorkbenchError(f"{str(text)!r}: an entry is BASE + FILE@STRENGTH (a plus with a space on each side), "
                             f"with nothing empty on either side of a plus")
    adapters = []
    for part in parts[1:]:
        head, sep, tail = part.rpartition("@")
        if sep and head and _STRENGTH.fullmatch(tail):
            strength = float(tail)
            if not abs(strength) <= MAX_STRENGTH:
                raise WorkbenchError(f"{part}: strength {tail} is outside -{MAX_STRENGTH:g} to {MAX_STRENGTH:g}")
            adapters.append((Path(head), strength))
        else:
            adapters.append((Path(part), 1.0))
    return parts[0], adapters


def is_entry(text: str | Path) -> bool:
    """Whether ``text`` names adapters besides its base (holds `` + ``)."""
    return ENTRY_SEPARATOR in str(text)


def entry_adapter(path: Path, strength: float) -> EntryAdapter:
    """An adapter file of an entry, its header read (bounded) for AUTOMATIC1111's short hash; a file that is not
    there or not a safetensors file is a one-line error."""
    from ..adapters import a1111_short_hash
    from ..readers import read_safetensors_head

    if not path.is_file():
        raise WorkbenchError(f"adapter file not found: {path}")
    head = read_safetensors_head(path)
    return EntryAdapter(path, strength, path.stem, a1111_short_hash(path, head.header_bytes))


def find_entry(ref: str | Path | Checkpoint | Entry, *, parts: str | Path | None = None) -> Entry:
    """The entry ``ref`` names: a found checkpoint, a reference to one, or ``BASE + FILE@S ...``."""
    from .find import find_checkpoint

    if isinstance(ref, Entry):
        return ref
    if isinstance(ref, Checkpoint):
        return Entry(ref if ref.path else find_checkpoint(ref.ref, parts=parts))
    base, adapters = parse_entry(ref)
    return Entry(find_checkpoint(base, parts=parts), tuple(entry_adapter(p, s) for p, s in adapters))


def open_entry(entry: Entry, **options):
    """The entry's pipeline: the base opened through the door (``load_pipeline``, with ``options``), each adapter
    applied at its strength (``apply_adapters``: every file judged against the denoiser before any is read)."""
    from ..adapters import apply_adapters
    from .open import load_pipeline

    pipe = load_pipeline(entry.base, **options)
    apply_adapters(pipe, [(a.path, a.strength) for a in entry.adapters])
    return pipe
