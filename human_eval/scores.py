"""Automated scores beside a study: evaluate's results store read, and each study model's row found by checkpoint hash.

`dwb evaluate run` appends one JSON object per (checkpoint, guidance[, sampler]) row to ``OUT/results.jsonl``
with the checkpoint's content hash (``checkpoint_hash``), the row's settings (``guidance``, ``sampler``) and
its metrics, each with a 95% interval as ``<metric>_lo`` / ``<metric>_hi`` where it was computed. A study keeps
each model's checkpoint hash and settings from the manifests it was made from (``Study.model_info``). The join
uses the hash, never the label: two stores may name the same checkpoint differently, and two checkpoints may
share a label. Of several rows with the model's hash, the one scored at the study's guidance and sampler is
taken; a model without a matching row is kept, without metrics, and the reason is said.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from models.common import loads_outside
from models.errors import WorkbenchError

from .errors import HumanEvalError
from .samples import with_sampler_key
from .study import Study

RESULTS = "results.jsonl"
# metric column -> True where higher is better; the table's metrics first (FID, FD-DINOv2, CLIP score, CMMD)
METRICS = {"fid": False, "fd_dinov2": False, "clip_score": True, "cmmd": False, "kid_mean": False,
           "fid_infinity": False, "attr_all_all": True, "precision": True, "recall": True,
           "pickscore": True, "hps": True, "imagereward": True, "aesthetic": True}
LABELS = {"fid": "FID", "fd_dinov2": "FD-DINOv2", "clip_score": "CLIP score", "cmmd": "CMMD", "kid_mean": "KID",
          "fid_infinity": "FD-infinity", "attr_all_all": "attribute accuracy", "precision": "precision",
          "recall": "recall", "pickscore": "PickScore", "hps": "HPSv2.1", "imagereward": "ImageReward",
          "aesthetic": "aesthetic score"}
ROW_KEYS = ("model", "checkpoint", "checkpoint_hash", "step", "guidance", "sampler", "n_images", "prompts")


@dataclass
class ScoreRows:
    """The ok rows of one or more results stores, and what was left out of them."""

    rows: list[dict] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    skipped: int = 0  # lines that are not a JSON object (a write cut short) or rows not scored ("unreadable")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _usable(row) -> bool:
    """A scored row whose checkpoint hash is text and whose settings and labels are plain values (a list where a
    label goes cannot be joined or shown)."""
    return (isinstance(row, dict) and row.get("status", "ok") == "ok" and isinstance(row.get("checkpoint_hash"), str)
            and all(isinstance(row.get(k), (str, int, float, type(None))) for k in ROW_KEYS))


def read_scores(folders: list[str | Path]) -> ScoreRows:
    """Every row with ``status`` "ok" of each folder's results.jsonl (or a results.jsonl path given directly)."""
    out = ScoreRows()
    for folder in folders:
        path = Path(folder)
        path = path / RESULTS if path.is_dir() else path
        if not path.is_file():
            raise HumanEvalError(f"no evaluate results at {path} (pass the --out folder of `dwb evaluate run`)")
        out.sources.append(str(path))
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            try:
                row = loads_outside(line, f"{path} line {lineno}")
            except WorkbenchError:  # cut short by a crash, nested too deep, too large: counted below
                row = None
            if not _usable(row):
                out.skipped += bool(line.strip())
                continue
            out.rows.append(with_sampler_key(row))  # a store of an older version says "scheduler"
    return out


def metric_values(row: dict) -> dict[str, dict]:
    """The row's metrics with their intervals: name -> {value, lo, hi} (None where not computed)."""
    out = {}
    for name in METRICS:
        value = _number(row.get(name))
        if value is not None:
            out[name] = {"value": value, "lo": _number(row.get(f"{name}_lo")), "hi": _number(row.get(f"{name}_hi"))}
    return out


def _same_setting(row: dict, info: dict) -> bool:
    guidance, sampler = _number(info.get("guidance")), info.get("sampler")
    if guidance is not None and not (_number(row.get("guidance")) is not None
                                     and math.isclose(_number(row.get("guidance")), guidance, abs_tol=1e-9)):
        return False
    return not sampler or row.get("sampler") == sampler


def match_row(model: str, info: dict, rows: list[dict]) -> tuple[dict | None, str]:
    """The row of one study model (by checkpoint hash, then the study's guidance and sampler) and a note."""
    hashes = [h for h in str(info.get("checkpoint_hash") or "").split(",") if h]
    if not hashes:
        return None, f"{model}: no checkpoint hash in its samples (images from a folder?), so no metrics"
    if len(hashes) > 1:
        return None, f"{model}: its samples come from {len(hashes)} checkpoints, so no single row of metrics"
    found = [r for r in rows if r["checkpoint_hash"] == hashes[0]]
    if not found:
        return None, f"{model}: no evaluate row with checkpoint hash {hashes[0]}, so no metrics"
    setting = [r for r in found if _same_setting(r, info)]
    if not setting:
        scored = ", ".join(sorted({f"guidance {r.get('guidance')} {r.get('sampler') or ''}".strip() for r in found}))
        return None, (f"{model}: checkpoint {hashes[0]} was scored at {scored}, not at the study's guidance "
                      f"{info.get('guidance')} {info.get('sampler') or ''}".rstrip() + ", so no metrics")
    newest = max(setting, key=lambda r: _number(r.get("time")) or 0.0)
    note = (f"{model}: {len(setting)} rows match checkpoint {hashes[0]} at the study's settings; the newest is used"
            if len(setting) > 1 else "")
    return newest, note


def join_scores(study: Study, scores: ScoreRows) -> tuple[dict[str, dict | None], list[str]]:
    """Each study model's row (None without one) and the notes that say why a model has no metrics."""
    joined, notes = {}, []
    for model in study.models:
        joined[model], note = match_row(model, study.model_info.get(model, {}), scores.rows)
        notes += [note] if note else []
    sizes = {r.get("n_images") for r in joined.values() if r is not None}
    if len(sizes) > 1:
        notes.append(f"the rows were scored on different numbers of images ({', '.join(sorted(map(str, sizes)))}): "
                     "FID and KID depend on it, so their order partly reflects the sample size (FD-infinity does not)")
    if scores.skipped:
        notes.append(f"{scores.skipped} lines of the results were not used (not scored, not a whole JSON row, too "
                     "large or nested too deep, or a label or setting that is not plain text or a number)")
    return joined, notes
