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

import html
import json
import logging
import math
import re
from pathlib import Path

import yaml

from ..common import interval_text, load_outside, loads_outside
from ..errors import WorkbenchError
from ..checkpoints import ARCHITECTURES

# What makes links, images, code, emphasis and table cells in Markdown; ``_`` stays (inside a word it is text,
# and names such as v_prediction are full of it).
MARKDOWN_PUNCTUATION = re.compile(r"([\\`*\[\]|~])")
RESULTS_FILE = "results.jsonl"
STUDY_RESULTS = Path("report") / "results.json"
log = logging.getLogger("checkpoints")
# evaluate's columns with intervals (``{name}_lo``/``{name}_hi``) shown on the card, and which way is better
METRICS = {"fid": ("FID", "lower"), "kid_mean": ("KID", "lower"), "clip_score": ("CLIP score", "higher"),
           "cmmd": ("CMMD", "lower"), "fd_dinov2": ("FD-DINOv2", "lower")}


def shown(value) -> str:
    """Text from a checkpoint, a results file or a study (a label, a sampler, a question) as it reads, on one line of
    the card: HTML escaped, every line break a space (no heading, list or table row of its own), Markdown's
    punctuation escaped (no link, image or cell of its own). A results row's ``<script>`` went into the card raw."""
    line = " ".join(str(value).splitlines())
    return MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(line, quote=False))


def _front_matter(spec: dict) -> dict:
    task = "image-to-image" if spec.get("refiner") is True else "text-to-image"
    data = {"library_name": "diffusers", "pipeline_tag": task, "license": "other",
            "tags": ["stable-diffusion", task, "diffusion-workbench"]}
    base = ARCHITECTURES.get(str(spec.get("architecture")), {}).get("hub_id")
    if base:
        data["base_model"] = base
    return data


def _quoted(value) -> str:
    """A YAML double-quoted scalar on one line: nothing in it can end the front matter or start a key."""
    return yaml.safe_dump(str(value), default_style='"', width=float("inf"), allow_unicode=True).strip()


def front_matter_text(data: dict) -> str:
    """The YAML between the card's ``---`` lines: our keys, every value (or list item) quoted."""
    lines = []
    for key, value in data.items():
        items = value if isinstance(value, list) else None
        lines += [f"{key}:", *(f"- {_quoted(v)}" for v in items)] if items is not None else [f"{key}: {_quoted(value)}"]
    return "\n".join(lines) + "\n"


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
    for section, values in (training.items() if isinstance(training, dict) else []):
        if isinstance(values, dict):
            said = ", ".join(f"{k} {json.dumps(v)}" for k, v in values.items() if v not in (None, "", [], {}))
            lines.append(f"- **{shown(section)}**: {shown(said) or 'defaults'}")
        elif values not in (None, "", [], {}):
            lines.append(f"- **{shown(section)}**: {shown(json.dumps(values))}")
    return lines


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _metric_rows(rows: list[dict]) -> list[str]:
    measured = [m for m in METRICS if any(_finite(r.get(m)) for r in rows)]
    if not measured:
        return []
    head = "| guidance | sampler | steps | images | " + " | ".join(
        f"{METRICS[m][0]} ({METRICS[m][1]} is better)" for m in measured) + " |"
    lines = [head, "|" + "---|" * (4 + len(measured))]
    for r in sorted(rows, key=lambda r: (r["guidance"] if _finite(r.get("guidance")) else 0, str(r.get("sampler")))):
        cells = []
        for m in measured:
            value, lo, hi = r.get(m), r.get(f"{m}_lo"), r.get(f"{m}_hi")
            cells.append(interval_text(value, lo, hi) if _finite(value, lo, hi)
                         else f"{value:.4g}" if _finite(value) else "")
        lines.append("| " + " | ".join(shown(r.get(k)) for k in ("guidance", "sampler", "steps", "n_images")) + " | "
                     + " | ".join(cells) + " |")
    return lines


def read_result_rows(folder: Path, checkpoint_hash: str) -> list[dict]:
    """The scored rows of a results store for one checkpoint hash; a line that is no JSON row (cut short by a crash,
    nested too deep: ``models.common.loads_outside``) is skipped with its reason."""
    path = Path(folder) / RESULTS_FILE if Path(folder).is_dir() else Path(folder)
    if not path.is_file():
        raise WorkbenchError(f"no evaluate results store at {folder} (expected {RESULTS_FILE})")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = loads_outside(line, f"{path} line {number}")
        except WorkbenchError as e:
            log.warning("skipped: %s", e)
            continue
        if isinstance(row, dict) and row.get("checkpoint_hash") == checkpoint_hash and row.get("status") == "ok":
            rows.append(row)
    return rows


def read_win_rates(folder: Path, checkpoint_hash: str) -> list[dict]:
    """A study's comparisons of this checkpoint against another: ``question``, ``opponent``, ``rate`` (of its
    decisive votes) and the report's interval (``clustered_wilson``: Wilson's on the effective votes), ``votes``."""
    path = Path(folder) / STUDY_RESULTS
    if not path.is_file():
        raise WorkbenchError(f"no human-eval report at {path} (run `dwb human-eval report` first)")
    report = load_outside(path, str(path))
    report = report if isinstance(report, dict) else {}
    info = report.get("model_info") if isinstance(report.get("model_info"), dict) else {}
    ours = {m for m, about in info.items()
            if isinstance(about, dict) and checkpoint_hash in str(about.get("checkpoint_hash") or "").split(",")}
    comparisons = report.get("comparisons") if isinstance(report.get("comparisons"), list) else []
    found = []
    for c in (c for c in comparisons if isinstance(c, dict)):
        side = "a" if str(c.get("model_a")) in ours else "b" if str(c.get("model_b")) in ours else None
        if side is None or not _finite(c.get("rate_a")):
            continue
        interval = c.get("clustered_wilson")
        lo, hi = interval if isinstance(interval, list) and len(interval) == 2 else (math.nan, math.nan)
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
        lines.append("| " + " | ".join(shown(w[k]) for k in ("study", "question", "opponent")) + f" | {rate} | "
                     + " | ".join(shown(w[k]) for k in ("votes", "ties")) + " |")
    return lines


def _absent_and_call(spec: dict) -> tuple[list[str], dict]:
    """The parts a model trained here leaves empty in its family's pipeline (those its family's assembly may lack,
    where the spec holds none: our MMDiT's T5; a Flux.1-style model's T5 is there), and what its pipeline is called
    with beyond prompts (``Family.call_options``)."""
    from ..families import family_or_ours

    family = family_or_ours(spec.get("family") if isinstance(spec.get("family"), str) else None)
    absent = [name for name in family.assembly.absent if name not in spec]
    absent += [name.replace("text_encoder", "tokenizer") for name in absent]
    denoiser = spec.get(family.denoiser) if isinstance(spec.get(family.denoiser), dict) else {}
    return absent, family.call_options(denoiser, all_text_encoders=not absent)


def loading_code(spec: dict, folder: str) -> str:
    """How diffusers loads the exported folder: ``DiffusionPipeline.from_pretrained``, told which parts are absent."""
    absent, _ = _absent_and_call(spec)
    return f"DiffusionPipeline.from_pretrained({json.dumps(folder)}{''.join(f', {n}=None' for n in absent)})"


def _call_lines(spec: dict) -> list[str]:
    _, options = _absent_and_call(spec)
    if not options:
        return []
    args = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return ["# trained on its CLIP states alone: called with no T5 tokens, as it was trained",
            f'image = pipe("a red circle", {args}).images[0]']


def _what(spec: dict) -> str:
    if spec.get("refiner") is True:
        return ("A refiner (a second stage: it finishes a base model's latents and draws nothing from text alone; "
                "`dwb sample BASE OUT --refiner FOLDER`)")
    return "A text-to-image latent diffusion model"


def model_card_text(spec: dict, *, label: str, checkpoint_hash: str, weights: str, timestamp=None,
               results: list[Path] = (), studies: list[Path] = ()) -> str:
    """The card's text: YAML header, description, training, and the scores found for ``checkpoint_hash``."""
    rows = [r for folder in results for r in read_result_rows(folder, checkpoint_hash)]
    wins = [w for folder in studies for w in read_win_rates(folder, checkpoint_hash)]
    vae = spec.get("vae") if isinstance(spec.get("vae"), dict) else {}
    lines = [f"---\n{front_matter_text(_front_matter(spec))}---", "", f"# {shown(label)}", "",
             f"{_what(spec)} exported by diffusion-workbench (`dwb export`) from checkpoint "
             f"{shown(label)} (content hash `{shown(checkpoint_hash)}`, {shown(weights)} weights).", "",
             "```python", "from diffusers import DiffusionPipeline",  # the folder's own pipeline class, any family
             f'pipe = {loading_code(spec, "path/to/this/folder")}', *_call_lines(spec), "```", "",
             "## Model", "",
             f"- **architecture**: {shown(spec.get('architecture'))}",
             f"- **prediction type**: {shown(spec.get('prediction_type'))}",
             f"- **resolution**: {shown(spec.get('resolution'))} px",
             f"- **latent scale**: {shown(vae.get('scaling_factor'))}", "",
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
