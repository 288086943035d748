"""Raters' votes on a comparison's image pairs, read from the files a `dwb human-eval` study keeps.

evaluate does not import human_eval; the two meet in files. A study folder holds ``study.json`` (its models
with their ``checkpoint_hash`` and settings, its prompts, images and pairs) and, once `dwb human-eval report`
has run, ``report/votes.json`` (one object per vote: ``rater``, ``pair``, ``kind``, ``question``, ``choice``,
the pair's image chosen: ``a``, ``b`` or ``none``). A study's model is checkpoint A of a comparison when its
checkpoint hash is A's and its guidance scale and sampler, where the study records them, are the compared
rows'; a study pair is a comparison's pair when it shows the same prompt (prompt set and index) and image
index. Only main pairs count: repeated showings (self-consistency) and gold checks are left out, and so are
the raters the study's report excluded (``report/results.json``, ``--exclude-failing-raters``). The same file's
comparisons give the raters' preference between two models with its interval and p as the report computed
them (``raters_preference``): the page shows those numbers, never a second computation of them.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from models.common import load_outside
from models.errors import WorkbenchError

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
class Preference:
    """One comparison of the study's report (``report/results.json``): a question and two of its model labels,
    the share of decisive votes for ``model_a`` with its 95% interval (Wilson on effective votes, the report's
    default) and the score test's p read off the same rule."""

    question: str
    model_a: str
    model_b: str
    votes: int
    decisive: int
    rate_a: float | None
    lo: float | None
    hi: float | None
    p: float | None


@dataclass(frozen=True)
class StudyVotes:
    """One study's main pairs and their votes, as its files hold them, and its report's preferences."""

    folder: Path
    models: dict[str, dict]  # label -> model info: checkpoint_hash (comma-separated), guidance, sampler, ...
    questions: tuple[str, ...]
    pairs: dict[str, StudyPair]  # main pair id -> its models and key
    votes: tuple[dict, ...]  # main votes of raters the report kept
    preferences: tuple[Preference, ...] = ()

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


# A vote is about 600 bytes in votes.json (`dwb human-eval report` writes it indented), an image and its pair
# about 700 in study.json: 256 MiB hold some 400,000 of either, beyond any study we run.
MAX_STUDY_BYTES = 256 * 1024 * 1024
VOTE_KEYS = ("rater", "pair", "question", "choice")


def _read_json(path: Path, missing: str):
    if not path.is_file():
        raise WorkbenchError(missing)
    return load_outside(path, str(path), max_bytes=MAX_STUDY_BYTES)


def _checked_votes(votes, path: Path) -> list[dict]:
    """The votes of ``report/votes.json``; a vote whose keys are not strings is a one-line error naming it."""
    if not isinstance(votes, list):
        raise WorkbenchError(f"{path}: expected a list of votes, got a JSON {type(votes).__name__}")
    for n, vote in enumerate(votes):
        if not isinstance(vote, dict) or not all(isinstance(vote.get(k), str) for k in VOTE_KEYS):
            raise WorkbenchError(f"{path}: vote {n} is not a vote (it needs {', '.join(VOTE_KEYS)} as strings)")
    return votes


def _integer(value) -> int | None:
    """A prompt or image index as the comparison's keys hold it; anything but an integer (or null) is refused."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"an index of {str(value)[:40]!r}")


def _main_pairs(study: dict) -> dict[str, StudyPair]:
    images, prompts = study["images"], study["prompts"]
    pairs = {}
    for p in study["pairs"]:
        if p.get("kind", "main") == "main":
            prompt = prompts[_integer(p["prompt"])]
            pairs[str(p["id"])] = StudyPair((str(images[p["a"]]["model"]), str(images[p["b"]]["model"])),
                                            (str(prompt.get("prompt_set") or ""), _integer(prompt.get("index")),
                                             _integer(p["image_index"])))
    return pairs


def read_study(folder: str | Path) -> StudyVotes:
    """A study's main pairs and the main votes of the raters its report kept; one-line errors for what is missing."""
    folder = Path(folder)
    study = _read_json(folder / STUDY, f"no study in {folder} ({STUDY} not found)")
    votes = _checked_votes(_read_json(folder / VOTES, f"{folder} has no {VOTES}: run `dwb human-eval report {folder}` "
                                                      f"first"), folder / VOTES)
    results = _read_json(folder / RESULTS, "") if (folder / RESULTS).is_file() else {}
    try:
        excluded = set(results.get("counts", {}).get("excluded_raters", []))
        pairs = _main_pairs(study)
        kept = tuple(v for v in votes if v["pair"] in pairs and v["rater"] not in excluded)
        questions = tuple(str(q["id"]) for q in study["questions"])
        models = {str(label): dict(info) for label, info in study["model_info"].items()}
        return StudyVotes(folder, models, questions, pairs, kept, _preferences(results.get("comparisons", [])))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise WorkbenchError(f"{folder}: {STUDY}, {VOTES} or {RESULTS} is not a study's ({type(e).__name__}: "
                             f"{str(e)[:80]})") from None


def _share(value) -> float | None:
    """A share or p-value of the report (null where there were no votes); anything else is refused."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1):
        return None if value is None else float(value)
    raise ValueError(f"a share of {str(value)[:40]!r}")


def _count(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"a count of {str(value)[:40]!r}")


def _preferences(comparisons) -> tuple[Preference, ...]:
    """The report's comparisons, each value checked for its kind (the file may have been written by anyone)."""
    found = []
    for c in comparisons:
        lo, hi = c.get("clustered_wilson") or (None, None)
        found.append(Preference(str(c["question"]), str(c["model_a"]), str(c["model_b"]), _count(c["votes"]),
                                _count(c["decisive"]), _share(c["rate_a"]), _share(lo), _share(hi),
                                _share(c.get("score_test_p"))))
    return tuple(found)


def raters_preference(studies: list[StudyVotes], row_a: dict, row_b: dict) -> list[dict]:
    """Per study and question, the raters' preference between rows A and B from the study's report, as `dwb
    human-eval report` computed it: ``rate_a`` (the share of decisive votes for the study's model a) with its 95%
    interval ``lo``, ``hi`` and ``p``, and ``model_a``: which of the comparison's sides, "A" or "B", the study's
    model a is."""
    found = []
    for study in studies:
        a_labels, b_labels = study.labels_of(row_a), study.labels_of(row_b)
        for pref in study.preferences:
            a_first = pref.model_a in a_labels and pref.model_b in b_labels
            if a_first or (pref.model_a in b_labels and pref.model_b in a_labels):
                found.append({"study": study.folder.name, "question": pref.question, "votes": pref.votes,
                              "decisive": pref.decisive, "rate_a": pref.rate_a, "lo": pref.lo, "hi": pref.hi,
                              "p": pref.p, "model_a": "A" if a_first else "B"})
    return found


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
