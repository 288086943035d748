"""Raters' votes on a comparison's image pairs, read from the files a `dwb human-eval` study keeps.

evaluate does not import human_eval; the two meet in files. A study folder holds ``study.json`` (its models
with their ``checkpoint_hash`` and settings, its prompts, images and pairs) and, once `dwb human-eval report`
has run, ``report/votes.json`` (one object per vote: ``rater``, ``pair``, ``kind``, ``question``, ``choice``,
the pair's image chosen: ``a``, ``b`` or ``none``). A study's model is checkpoint A of a comparison when its
checkpoint hash is A's and its guidance scale and sampler, where the study records them, are the compared
rows'; a study pair is a comparison's pair when it shows the same prompt (prompt set and index) and image
index. Only main pairs count: repeated showings (self-consistency) and gold checks are left out, and so are
the raters the study's report excluded (``report/results.json``, ``--exclude-failing-raters``).
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from train.errors import WorkbenchError

STUDY = "study.json"
VOTES = Path("report") / "votes.json"
RESULTS = Path("report") / "results.json"
CHOICES = ("A", "B", "neither")  # what a rater preferred, on the comparison's sides

PairKey = tuple[str, int, int]  # (prompt set, prompt index, image index): one image of each checkpoint
Counts = dict[str, dict[str, int]]  # question -> choice -> raters


@dataclass(frozen=True)
class StudyPair:
    models: tuple[str, str]  # the labels of the study's images a and b
    key: PairKey


@dataclass(frozen=True)
class StudyVotes:
    """One study's main pairs and their votes, as its files hold them."""

    folder: Path
    models: dict[str, dict]  # label -> model info: checkpoint_hash (comma-separated), guidance, sampler, ...
    questions: tuple[str, ...]
    pairs: dict[str, StudyPair]  # main pair id -> its models and key
    votes: tuple[dict, ...]  # main votes of raters the report kept

    def labels_of(self, row: dict) -> set[str]:
        """The study's labels for the checkpoint and settings of an evaluate row."""
        return {label for label, info in self.models.items() if _same_images(info, row)}

    def described(self) -> str:
        """Its models for a message: ``label (hash, guidance g)``."""
        return ", ".join(f"{label} ({info.get('checkpoint_hash') or 'no hash'}"
                         + (f", guidance {info['guidance']})" if info.get("guidance") is not None else ")")
                         for label, info in self.models.items())


def _same_images(info: dict, row: dict) -> bool:
    hashes = set(str(info.get("checkpoint_hash") or "").split(",")) - {""}
    return (row.get("checkpoint_hash") in hashes
            and info.get("guidance") in (None, row["guidance"])
            and info.get("sampler") in (None, row.get("sampler")))


def _read_json(path: Path, missing: str):
    if not path.is_file():
        raise WorkbenchError(missing)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkbenchError(f"{path}: not valid JSON ({e})") from None


def _main_pairs(study: dict) -> dict[str, StudyPair]:
    images, prompts = study["images"], study["prompts"]
    pairs = {}
    for p in study["pairs"]:
        if p.get("kind", "main") == "main":
            prompt = prompts[p["prompt"]]
            pairs[p["id"]] = StudyPair((images[p["a"]]["model"], images[p["b"]]["model"]),
                                       (prompt.get("prompt_set") or "", prompt.get("index"), p["image_index"]))
    return pairs


def read_study(folder: str | Path) -> StudyVotes:
    """A study's main pairs and the main votes of the raters its report kept; one-line errors for what is missing."""
    folder = Path(folder)
    study = _read_json(folder / STUDY, f"no study in {folder} ({STUDY} not found)")
    votes = _read_json(folder / VOTES, f"{folder} has no {VOTES}: run `dwb human-eval report {folder}` first")
    results = _read_json(folder / RESULTS, "") if (folder / RESULTS).is_file() else {}
    excluded = set(results.get("counts", {}).get("excluded_raters", []))
    try:
        pairs = _main_pairs(study)
        kept = tuple(v for v in votes if v["pair"] in pairs and v["rater"] not in excluded)
        return StudyVotes(folder, study["model_info"], tuple(q["id"] for q in study["questions"]), pairs, kept)
    except (KeyError, IndexError, TypeError) as e:
        raise WorkbenchError(f"{folder}: {STUDY} or {VOTES} is not a study's (no {e})") from None


def _sides(pair: StudyPair, a_labels: set[str], b_labels: set[str]) -> str | None:
    """"AB" when the study pair's image a is A's and b is B's, "BA" the other way round, None for other models."""
    first, second = pair.models
    if first in a_labels and second in b_labels:
        return "AB"
    if first in b_labels and second in a_labels:
        return "BA"
    return None


def pair_votes(studies: list[StudyVotes], row_a: dict, row_b: dict) -> dict[PairKey, Counts]:
    """How many raters preferred A, B or neither, per question, on each image pair of rows A and B, summed over
    the studies."""
    counts: dict[PairKey, Counts] = defaultdict(lambda: defaultdict(lambda: dict.fromkeys(CHOICES, 0)))
    for study in studies:
        a_labels, b_labels = study.labels_of(row_a), study.labels_of(row_b)
        for vote in study.votes:
            pair = study.pairs[vote["pair"]]
            sides = _sides(pair, a_labels, b_labels)
            if sides:
                choice = sides["ab".index(vote["choice"])] if vote["choice"] in ("a", "b") else "neither"
                counts[pair.key][vote["question"]][choice] += 1
    return counts


def rates_pairs_of(study: StudyVotes, row_a: dict, row_b: dict) -> bool:
    """Whether the study has a main pair of row A's images against row B's."""
    a_labels, b_labels = study.labels_of(row_a), study.labels_of(row_b)
    return any(_sides(p, a_labels, b_labels) for p in study.pairs.values())


def check_studies(studies: list[StudyVotes], sections: list[tuple[dict, dict]]) -> None:
    """Each study must rate A's images against B's at one of the compared guidance scales: else a one-line error."""
    for study in studies:
        if not any(rates_pairs_of(study, a, b) for a, b in sections):
            a, b = sections[0]
            scales = ", ".join(f"{ra['guidance']:g}" for ra, _ in sections)
            raise WorkbenchError(f"{study.folder} is a study of other checkpoints or settings: it rates "
                                 f"{study.described()}, not {a['model']} ({a.get('checkpoint_hash')}) against "
                                 f"{b['model']} ({b.get('checkpoint_hash')}) at guidance {scales}")
