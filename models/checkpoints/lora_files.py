"""LoRA files under allowed folders, and the ``<lora:NAME:STRENGTH>`` tags of a prompt resolved among them: the one
rule the app (its folders) and `dwb sample` (``--lora-dir``) resolve a tag's NAME by.

The files are found under the allowed folders by the same rules as checkpoints (``find``: each resolved, ``..`` and
links followed, and left out where it lies or links outside them; hidden folders and a diffusers pipeline's insides
skipped), and listed by their label, never by the server's path. A file is listed when its safetensors header (read
bounded, ``models.readers``) names adapter weights; whether it fits a checkpoint is judged when it is applied
(``models.adapters.apply_adapters``). A tag's NAME is looked up in that listing (a file's stem, as AUTOMATIC1111 looks
it up, or its label): no text a client sends is ever opened as a path.

Where the caller gives ``exported`` (the app does), a run's adapter checkpoints under the roots (Composer files whose
spec holds an ``adapter:`` section, read without running code) are listed too, named as a run names them
(``ep0-ba2`` for ``ep0-ba2-rank0.pt``, or by label): what is applied and hashed is the file ``exported`` writes of
one (``models.export.AdapterExports``: into the caller's own cache, never beside the checkpoint).
"""
from __future__ import annotations

import difflib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..adapters import a1111_short_hash, is_adapter_key
from ..errors import WorkbenchError, first_line
from ..generation import MAX_STRENGTH, lora_tags
from ..readers import read_safetensors_head
from .composer import read_summary
from .find import check_reads_inside, label_under
from .names import Checkpoint, in_run_listing

SUFFIX = ".safetensors"  # adapter files from elsewhere are read from safetensors only (a pickle could run code)
CHECKPOINT_SUFFIX = ".pt"  # an adapter checkpoint of a run (its pickle read by the door's skeleton reader, no code run)
MAX_DEPTH = 8  # folders below a root that are searched, as for checkpoints
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
NAMES_SHOWN = 5  # LoRA names an "unknown LoRA" message offers


@dataclass(frozen=True)
class LoraFile:
    label: str  # its path under the roots, as a listing shows it
    path: Path  # resolved, under a root
    checkpoint: bool = False  # an adapter checkpoint of a run, applied as the file it is exported to

    @property
    def stem(self) -> str:
        """The NAME a tag gives it: a file's stem, as A1111 names it; a checkpoint's as its run names it (``ep0-ba2``:
        rank 0's file stands for the checkpoint)."""
        return self.path.stem.removesuffix("-rank0") if self.checkpoint else self.path.stem

    @property
    def bare(self) -> str:
        """Its label without the file's suffix."""
        return self.label.removesuffix(self.path.suffix)


@dataclass(frozen=True)
class ChosenLora:
    """A tag of a prompt resolved: the file, the name the tag gave it (what ``Lora hashes`` records, as A1111 records
    the name mentioned), its strength, AUTOMATIC1111's short hash of the file applied and that file (the listed file
    itself, or an adapter checkpoint's exported file)."""

    file: LoraFile
    name: str
    strength: float
    hash: str
    path: Path

    def key(self) -> tuple:
        return str(self.path), self.hash, self.strength


def is_adapter_checkpoint(path: Path) -> bool:
    """Whether a Composer checkpoint's spec holds an ``adapter:`` section (a run that trained an adapter alone); False
    for a file that does not read as one."""
    try:
        return isinstance(read_summary(path)["spec"].get("adapter"), dict)
    except (WorkbenchError, AttributeError, KeyError, TypeError):
        return False


def holds_adapter(path: Path) -> bool:
    """Whether a safetensors file's header names adapter weights (a LoRA, LoHa, LoKr or DoRA in any layout); False for
    a file that does not read as safetensors."""
    try:
        head = read_safetensors_head(path)
    except WorkbenchError:
        return False
    return any(is_adapter_key(key) or ".lora." in key for key in head.tensors)


class LoraFiles:
    """The adapter files under ``roots``; headers and hashes cached by each file's (path, size, modification time).
    ``where`` names the roots in messages (the app's folders, `dwb sample`'s ``--lora-dir``), never by their path;
    ``exported`` (an adapter checkpoint's resolved path -> the file its adapter is written to) lists adapter
    checkpoints too."""

    def __init__(self, roots: list[Path], where: str = "the app's folders",
                 exported: Callable[[Path], Path] | None = None):
        self.roots, self.where, self.exported = roots, where, exported
        self._adapter: dict[tuple, bool] = {}
        self._hashes: dict[tuple, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _version(path: Path) -> tuple:
        st = path.stat()
        return str(path), st.st_size, st.st_mtime_ns

    def listing(self) -> list[LoraFile]:
        """Every adapter file under the roots, by label (each file once, whatever links lead to it)."""
        found: dict[Path, LoraFile] = {}
        for root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
                here = Path(dirpath)
                if "model_index.json" in filenames:  # a pipeline's parts, no adapter of its own
                    dirnames[:] = []
                    continue
                depth = len(here.relative_to(root).parts)
                dirnames[:] = [d for d in dirnames
                               if not d.startswith(".") and d not in SKIP_DIRS and depth < MAX_DEPTH]
                for name in sorted(n for n in filenames if n.endswith(SUFFIX) or self._checkpoint_name(n)):
                    listed = self._listed(here / name)
                    if listed is not None:
                        found.setdefault(listed.path, listed)
        return sorted(found.values(), key=lambda f: f.label)

    def _checkpoint_name(self, name: str) -> bool:
        """Whether a file of this name may be an adapter checkpoint to list (rank 0's file of a run's checkpoint)."""
        return self.exported is not None and name.endswith(CHECKPOINT_SUFFIX) and in_run_listing(name)

    def _listed(self, path: Path) -> LoraFile | None:
        """The file at ``path`` as a listing entry, or None where it lies or links outside the roots, or holds no
        adapter."""
        try:
            real = path.resolve()
            if not real.is_file():
                return None
            label = label_under(real, self.roots) if any(real.is_relative_to(r) for r in self.roots) else None
            if label is None:
                return None
            check_reads_inside(real, self.roots, label)
            version = self._version(real)
        except (OSError, RuntimeError, ValueError, WorkbenchError):
            return None
        checkpoint = self.exported is not None and real.suffix == CHECKPOINT_SUFFIX
        known = self._holds(version, is_adapter_checkpoint if checkpoint else holds_adapter)
        return LoraFile(label, real, checkpoint) if known else None

    def _holds(self, version: tuple, reads: Callable[[Path], bool]) -> bool:
        """``reads(path)`` for the file of ``version`` (path, size, modification time), once per version."""
        with self._lock:
            known = self._adapter.get(version)
        if known is None:
            known = reads(Path(version[0]))
            with self._lock:
                self._adapter[version] = known
        return known

    def lists_as_lora(self, ckpt: Checkpoint) -> bool:
        """Whether a listed checkpoint is a run's adapter checkpoint (listed here, among the LoRAs, where the
        caller exports them), read once per version of its file."""
        if self.exported is None or ckpt.kind != "composer" or ckpt.path is None or not Path(ckpt.path).is_file():
            return False
        try:
            version = self._version(Path(ckpt.path))
        except OSError:
            return False
        return self._holds(version, is_adapter_checkpoint)

    def applied(self, lora: LoraFile) -> Path:
        """The file applied for ``lora``: the file itself, or an adapter checkpoint's exported file; a one-line
        WorkbenchError naming it by label where it cannot be exported."""
        if not lora.checkpoint:
            return lora.path
        try:
            return self.exported(lora.path)
        except Exception as e:  # noqa: BLE001 - a file from anywhere: its one line, or what a reader raised
            reason = first_line(e) if isinstance(e, WorkbenchError) else f"{type(e).__name__}: {first_line(e)}"
            raise WorkbenchError(f"LoRA {lora.label}: {reason.replace(str(lora.path), lora.label)}") from None

    def short_hash(self, lora: LoraFile) -> str:
        """AUTOMATIC1111's short hash of the file applied (``models.adapters.a1111_short_hash``; an adapter
        checkpoint's exported file), computed once per version of the listed file."""
        version = self._version(lora.path)
        with self._lock:
            if version in self._hashes:
                return self._hashes[version]
        path = self.applied(lora)
        digest = a1111_short_hash(path, read_safetensors_head(path).header_bytes)
        with self._lock:
            self._hashes[version] = digest
        return digest

    def by_hash(self, digest: str, listing: list[LoraFile] | None = None) -> LoraFile | None:
        """The listed file whose short hash is ``digest`` (A1111 writes 12 hex digits; a shorter start matches too)."""
        digest = digest.strip().lower()
        if len(digest) < 8:
            return None
        for lora in self.listing() if listing is None else listing:
            try:
                if self.short_hash(lora).startswith(digest):
                    return lora
            except (OSError, WorkbenchError):
                continue
        return None

    def tag_name(self, lora: LoraFile, listing: list[LoraFile]) -> str:
        """The NAME a tag gives the file: its stem, as A1111 names it, or its label without the suffix where another
        listed file has the same stem."""
        same = [f for f in listing if f.stem == lora.stem]
        return lora.stem if len(same) == 1 else lora.bare

    def find(self, name: str, listing: list[LoraFile]) -> LoraFile:
        """The listed file a tag's NAME means: its label (with or without the suffix) or its stem; a one-line
        WorkbenchError naming the LoRAs there are where none, or several, are meant."""
        exact = [f for f in listing if name in (f.label, f.bare)]
        by_stem = [f for f in listing if f.stem == name]
        found = exact or by_stem
        if len(found) == 1:
            return found[0]
        if found:
            raise WorkbenchError(f"<lora:{name}>: {len(found)} LoRA files are named {name!r} "
                                 f"({', '.join(f.label for f in found[:NAMES_SHOWN])}): name one by its label")
        names = sorted({self.tag_name(f, listing) for f in listing})
        near = sorted(names, key=lambda n: difflib.SequenceMatcher(None, name, n).ratio(), reverse=True)[:NAMES_SHOWN]
        more = f" and {len(names) - len(near)} more" if len(names) > len(near) else ""
        known = f"the LoRAs in {self.where}: {', '.join(near)}{more}" if names else \
            f"no LoRA file is in {self.where}"
        raise WorkbenchError(f"unknown LoRA {name[:80]!r} in <lora:...>; {known}")

    def chosen(self, prompt: str) -> tuple[str, tuple[ChosenLora, ...]]:
        """(the prompt as the model reads it, the LoRAs its tags name, resolved); one-line WorkbenchError for a tag
        that does not read, an unknown name or a strength out of bounds."""
        text, tags = lora_tags(prompt)
        if not tags:
            return text, ()
        listing = self.listing()
        chosen = []
        for tag in tags:
            if not abs(tag.strength) <= MAX_STRENGTH:
                raise WorkbenchError(f"<lora:{tag.name}>: strength {tag.strength:g} is outside "
                                     f"-{MAX_STRENGTH:g} to {MAX_STRENGTH:g}")
            lora = self.find(tag.name, listing)
            chosen.append(ChosenLora(lora, tag.name, tag.strength, self.short_hash(lora), self.applied(lora)))
        if len({c.file.path for c in chosen}) < len(chosen):
            raise WorkbenchError("the prompt names one LoRA file twice: give it once, with one strength")
        return text, tuple(chosen)
