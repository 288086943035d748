"""An adapter checkpoint's adapter as the one file the readers take (``models.adapters.apply_adapters``): the one rule
every command that applies a run's adapter checkpoint follows, `dwb evaluate watch` (into its output folder) and the
app (``AdapterExports``: into a cache folder of its own, once per version of the checkpoint's file).

The layout is the family's ``lora_layout`` for a LoRA (kohya's, which AUTOMATIC1111 reads, for SD 1/2 and SDXL), the
peft layout (which holds every kind and family) otherwise; the weights are EMA or raw as ``weights`` chooses
(``models.checkpoints.weights_of``: auto, ema, raw)."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from ..checkpoints import Checkpoint, read_summary, weights_of
from ..errors import WorkbenchError
from ..families import family_named
from .adapter_export import adapter_of, export_adapter


def adapter_layout(ckpt: Checkpoint) -> str:
    """The layout an adapter checkpoint's adapter is written in: its family's ``lora_layout`` for a LoRA, peft
    otherwise."""
    adapter = adapter_of(ckpt)
    if adapter is None:
        raise WorkbenchError(f"{ckpt.label} holds no adapter")
    family = family_named(read_summary(ckpt.path)["spec"].get("family"))
    return family.lora_layout if adapter.get("type") == "lora" else "peft"


def write_adapter_file(ckpt: Checkpoint, out: str | Path, weights: str = "auto") -> Path:
    """The adapter of the local adapter checkpoint ``ckpt`` written to ``out`` (whole or not at all) in
    ``adapter_layout``, its weights those ``weights`` chooses."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return export_adapter(ckpt.path, out, layout=adapter_layout(ckpt), ema=weights_of(ckpt, weights) == "ema")


class AdapterExports:
    """Adapter checkpoints written as files into ``folder`` (a cache of the caller's own, never beside the
    checkpoint), each once per version of its file: ``folder/<identity>/<checkpoint's stem>.safetensors``, the identity
    a hash of the checkpoint's file identity (device, inode, size, modification time) and the weights chosen, so a
    checkpoint rewritten in place is written again and an unchanged one is read from the cache, also by the next
    process."""

    def __init__(self, folder: str | Path, weights: str = "auto"):
        self.folder, self.weights = Path(folder), weights
        self._lock = threading.Lock()

    def identity(self, ckpt: Checkpoint) -> str:
        """The hash the exported file is named by: the checkpoint file's identity and the weights chosen."""
        st = Path(ckpt.path).stat()
        key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{weights_of(ckpt, self.weights)}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def file_of(self, ckpt: Checkpoint) -> Path:
        """The exported file of ``ckpt`` in the cache, written first where this version has none yet."""
        out = self.folder / self.identity(ckpt) / f"{Path(ckpt.path).stem}.safetensors"
        with self._lock:  # one export per file at a time; a finished one is renamed into place whole
            if not out.is_file():
                write_adapter_file(ckpt, out, self.weights)
        return out
