"""The model card `dwb export` writes into an exported folder: ``README.md`` in the Hugging Face hub's convention.

A YAML header (``library_name``, ``pipeline_tag``, ``base_model`` where the architecture has one, tags),
then what the checkpoint says about itself: architecture, prediction type, resolution, the training data
and schedule its spec recorded (``spec["training"]``, written by `dwb train`) and how far it had trained.
Scores join in by the checkpoint's content hash (``hashing.content_hash``, what evaluate's rows and a
study's models record): an evaluate results store's rows (``results.jsonl``: each metric with its 95%
interval) and a human study's report (``report/results.json``: win rates with their intervals). Both are
read as files; ``train`` imports neither package.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from ..common import interval_text
from ..errors import WorkbenchError
from .architectures import ARCHITECTURES

RESULTS_FILE = "results.jsonl"
STUDY_RESULTS = Path("report") / "results.json"
# evaluate's columns with intervals (``{name}_lo``/``{name}_hi``) shown on the card, and which way is better
METRICS = {"fid": ("FID", "lower"), "kid_mean": ("KID", "lower"), "clip_score": ("CLIP score", "higher"),
           "cmmd": ("CMMD", "lower"), "fd_dinov2": ("FD-DINOv2", "lower")}


def _front_matter(spec: dict) -> dict:
    data = {"library_name": "diffusers", "pipeline_tag": "text-to-image", "license": "other",
            "tags": ["stable-diffusion", "text-to-image", "diffusion-workbench"]}
    base = ARCHITECTURES.get(spec.get("architecture"), {}).get("hub_id")
    if base:
        data["base_model"] = base
    return data


def _trained(timestamp) -> str | None:
    ts = timestamp.get("Timestamp", timestamp) if isinstance(timestamp, dict) else None
    if not isinstance(ts, dict):
        return None
    parts = [f"{int(ts[k]):,} {name}" for k, name in (("batch", "batches"), ("sample", "samples"),
                                                     ("epoch", "epochs")) if isinstance(ts.get(k), (int, float))]
    return ", ".join(parts) or None


def _training_lines(training: dict | None) -> list[str]:
    if not training:
        return ["The checkpoint does not record its training data and schedule (checkpoints `dwb train` "
                "wrote before the spec kept them, and mosaicml/diffusion's, do not)."]
    lines = []
    for section, values in training.items():
        if isinstance(values, dict):
            shown = ", ".join(f"{k} {json.dumps(v)}" for k, v in values.items() if v not in (None, "", [], {}))
            lines.append(f"- **{section}**: {shown or 'defaults'}")
        elif values not in (None, "", [], {}):
            lines.append(f"- **{section}**: {json.dumps(values)}")
    return lines


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _metric_rows(rows: list[dict]) -> list[str]:
    shown = [m for m in METRICS if any(_finite(r.get(m)) for r in rows)]
    if not shown:
        return []
    head = "| guidance | sampler | steps | images | " + " | ".join(
        f"{METRICS[m][0]} ({METRICS[m][1]} is better)" for m in shown) + " |"
    lines = [head, "|" + "---|" * (4 + len(shown))]
    for r in sorted(rows, key=lambda r: (r.get("guidance") or 0, str(r.get("sampler")))):
        cells = []
        for m in shown:
            value, lo, hi = r.get(m), r.get(f"{m}_lo"), r.get(f"{m}_hi")
            cells.append(interval_text(value, lo, hi) if _finite(value, lo, hi)
                         else f"{value:.4g}" if _finite(value) else "")
        lines.append(f"| {r.get('guidance')} | {r.get('sampler')} | {r.get('steps')} | {r.get('n_images')} | "
                     + " | ".join(cells) + " |")
    return lines


def read_result_rows(folder: Path, checkpoint_hash: str) -> list[dict]:
    """The scored rows of a results store for one checkpoint hash (a line cut short by a crash is skipped)."""
    path = Path(folder) / RESULTS_FILE if Path(folder).is_dir() else Path(folder)
    if not path.is_file():
        raise WorkbenchError(f"no evaluate results store at {folder} (expected {RESULTS_FILE})")
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("checkpoint_hash") == checkpoint_hash and row.get("status") == "ok":
            rows.append(row)
    return rows


def read_win_rates(folder: Path, checkpoint_hash: str) -> list[dict]:
    """A study's comparisons of this checkpoint against another: ``question``, ``opponent``, ``rate`` (of its
    decisive votes) and the report's interval (``clustered_wilson``: Wilson's on the effective votes), ``votes``."""
    path = Path(folder) / STUDY_RESULTS
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkbenchError(f"no human-eval report at {path} (run `dwb human-eval report` first): "
                             f"{type(e).__name__}") from None
    ours = {m for m, info in (report.get("model_info") or {}).items()
            if checkpoint_hash in str(info.get("checkpoint_hash") or "").split(",")}
    found = []
    for c in report.get("comparisons") or []:
        side = "a" if c.get("model_a") in ours else "b" if c.get("model_b") in ours else None
        if side is None or not _finite(c.get("rate_a")):
            continue
        lo, hi = c.get("clustered_wilson") or (math.nan, math.nan)
        rate = c["rate_a"] if side == "a" else 1 - c["rate_a"]
        lo, hi = (lo, hi) if side == "a" else (1 - hi, 1 - lo) if _finite(lo, hi) else (lo, hi)
        found.append({"study": report.get("study"), "question": c.get("question"), "rate": rate, "lo": lo, "hi": hi,
                      "opponent": c["model_b"] if side == "a" else c["model_a"], "votes": c.get("votes"),
                      "ties": c.get("ties")})
    return found


def _win_rate_rows(wins: list[dict]) -> list[str]:
    lines = ["| study | question | against | win rate (95% interval) | votes | ties |", "|---|---|---|---|---|---|"]
    for w in wins:
        rate = (interval_text(100 * w["rate"], 100 * w["lo"], 100 * w["hi"]) + " %" if _finite(w["lo"], w["hi"])
                else f"{100 * w['rate']:.1f} %")
        lines.append(f"| {w['study']} | {w['question']} | {w['opponent']} | {rate} | {w['votes']} | {w['ties']} |")
    return lines


def model_card_text(spec: dict, *, label: str, checkpoint_hash: str, weights: str, timestamp=None,
               results: list[Path] = (), studies: list[Path] = ()) -> str:
    """The card's text: YAML header, description, training, and the scores found for ``checkpoint_hash``."""
    rows = [r for folder in results for r in read_result_rows(folder, checkpoint_hash)]
    wins = [w for folder in studies for w in read_win_rates(folder, checkpoint_hash)]
    header = yaml.safe_dump(_front_matter(spec), sort_keys=False)
    lines = [f"---\n{header}---", "", f"# {label}", "",
             f"A text-to-image latent diffusion model exported by diffusion-workbench (`dwb export`) from checkpoint "
             f"`{label}` (content hash `{checkpoint_hash}`, {weights} weights).", "",
             "```python", "from diffusers import StableDiffusionPipeline",
             'pipe = StableDiffusionPipeline.from_pretrained("path/to/this/folder")', "```", "",
             "## Model", "",
             f"- **architecture**: {spec.get('architecture')}", f"- **prediction type**: {spec.get('prediction_type')}",
             f"- **resolution**: {spec.get('resolution')} px",
             f"- **latent scale**: {spec.get('vae', {}).get('scaling_factor')}", "",
             "## Training", ""]
    trained = _trained(timestamp)
    if trained:
        lines += [f"Trained for {trained} when this checkpoint was saved.", ""]
    lines += [*_training_lines(spec.get("training")), ""]
    lines += ["## Evaluation", ""]
    if rows:
        lines += ["Scores from `dwb evaluate` (95% bootstrap intervals), joined by the checkpoint's content hash:", "",
                  *_metric_rows(rows), ""]
    if wins:
        lines += ["Human preference from `dwb human-eval` studies (share of decisive votes won):", "",
                  *_win_rate_rows(wins), ""]
    if not rows and not wins:
        lines += ["No scores were given for this checkpoint (`dwb export --results FOLDER --study FOLDER`).", ""]
    return "\n".join(lines)
