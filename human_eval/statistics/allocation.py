"""Where the next showing goes, and when a study has votes enough.

*Uniform* allocation (the default): every rater walks all pairs in their own random order, so each
model pair gets showings in proportion to its pairs. *Adaptive* allocation is Chatbot Arena's active
sampling made a study setting (Chiang et al. 2024, "Chatbot Arena", sec. 5: sample the pair whose
estimate would gain most): each new showing of a main pair goes to the model pair whose preference
interval is widest relative to its distance from 50%, `priority`; the rater still gets that model
pair's next pair in their own random order, with sides drawn per showing, and gold and repeated pairs
keep their place in that order.

*Stopping rule*: a comparison (a model pair on one question) is settled when its 95% interval excludes
50% or is narrower than the target width; a study is done when every comparison is settled. The interval
is the report's default: Wilson's on the effective number of decisive votes, divided by the clustering's
design effect where it is known (the report knows it; the live server takes 1). `votes_to_settle`
predicts how many votes that takes.
"""
from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict

from .stats import Z95, clustered_wilson_interval, decisive_votes_needed, is_decisive

ModelPair = tuple[str, str]


def _half_width(p: float, n: float, z: float = Z95) -> float:
    """Half the Wilson width at rate p after n decisive votes (n may be fractional: pending votes)."""
    return z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))


def settled(wins_a: int, decisive: int, target_width: float, deff: float = 1.0) -> bool:
    """The stopping rule for one comparison: its 95% interval excludes 50% or is narrower than the target.

    The interval is the report's: Wilson's on the effective number of votes, decisive / deff
    (``stats.clustered_wilson_interval``), so a comparison the rule calls settled has, in the report, an
    interval clear of 50% or that narrow.
    """
    if decisive == 0:
        return False
    lo, hi = clustered_wilson_interval(wins_a, decisive, deff)
    return lo > 0.5 or hi < 0.5 or hi - lo < target_width


def priority(wins_a: float, decisive: float, target_width: float, pending: float = 0.0) -> float:
    """Interval width over max(2 x distance from 50%, target width): above 1 while a comparison is unsettled.

    `pending` decisive votes (shown, not answered yet) count towards the width, so raters who start at
    the same moment are not all sent to the same model pair.
    """
    n = decisive + pending
    if n <= 0:
        return math.inf
    p = wins_a / decisive if decisive else 0.5
    return 2 * _half_width(p, n) / max(2 * abs(p - 0.5), target_width)


def decisive_to_exclude_half(p: float, deff: float = 1.0) -> float:
    """The fewest decisive votes at rate p whose 95% interval (on decisive / deff effective votes) excludes 50%;
    inf at p = 0.5."""
    if abs(p - 0.5) < 1e-9:
        return math.inf
    p = min(max(p, 1e-6), 1 - 1e-6)

    def excludes(n: int) -> bool:
        lo, hi = clustered_wilson_interval(p * n, n, deff)
        return lo > 0.5 or hi < 0.5

    lo, hi = 1, 1
    while not excludes(hi):
        hi *= 2
        if hi > 1 << 40:
            return math.inf
    while lo < hi:  # bisect: past the first n that excludes 50%, every larger n does
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if excludes(mid) else (mid + 1, hi)
    return float(lo)


def decisive_to_settle(p: float, target_width: float, deff: float = 1.0) -> float:
    """Decisive votes the stopping rule needs at rate p: the sooner of a narrow interval (deff times the votes
    of independent ones) or one clear of 50%."""
    narrow = math.ceil(max(deff, 1.0) * decisive_votes_needed(target_width, p))
    return min(float(narrow), decisive_to_exclude_half(p, deff))


def votes_to_settle(comparisons: list[dict], target_width: float) -> dict:
    """Predicted main votes until every comparison is settled, for adaptive and for uniform allocation.

    comparisons: dicts with model_a, model_b, rate_a, tie_rate and optionally design_effect. A model
    pair takes as many showings as its slowest question; uniform allocation gives every model pair the
    showings of the slowest one, adaptive only what each needs.
    """
    showings: dict[ModelPair, float] = defaultdict(float)
    questions: Counter = Counter()
    for c in comparisons:
        pair = (c["model_a"], c["model_b"])
        questions[pair] += 1
        rate = c.get("rate_a")
        rate = 0.5 if rate is None or math.isnan(rate) else rate
        ties = c.get("tie_rate")
        ties = 0.0 if ties is None or math.isnan(ties) else min(ties, 0.95)
        deff = c.get("design_effect") or 1.0
        showings[pair] = max(showings[pair], decisive_to_settle(rate, target_width, deff) / (1 - ties))
    per_pair = {pair: n * questions[pair] for pair, n in showings.items()}  # votes: one per question and showing
    finite = all(math.isfinite(v) for v in per_pair.values())
    return {"adaptive": math.ceil(sum(per_pair.values())) if finite else None,
            "uniform": math.ceil(len(per_pair) * max(per_pair.values())) if finite and per_pair else None,
            "per_model_pair": {f"{a} vs {b}": (math.ceil(v) if math.isfinite(v) else None) for (a, b), v in per_pair.items()}}


def stopping_point(votes: list[dict], model_pair_of: dict[str, ModelPair], questions: tuple[str, ...],
                   target_width: float, deff: dict[tuple[str, str, str], float] | None = None) -> dict:
    """Replay main votes in order: after how many the stopping rule first held, and what is still open now.

    votes: the store's rows (pair_id, question, choice), oldest first; model_pair_of: main pair id ->
    (model a, model b); deff: (question, model a, model b) -> design effect.
    """
    deff = deff or {}
    keys = [(q, *pair) for pair in dict.fromkeys(model_pair_of.values()) for q in questions]
    counts = {k: [0, 0] for k in keys}  # wins_a, decisive
    still_open, met_at, spent = set(keys), None, 0
    for v in votes:
        pair = model_pair_of.get(v["pair_id"])
        if pair is None or v["question"] not in questions:
            continue
        spent += 1
        key = (v["question"], *pair)
        if is_decisive(v["choice"]):
            counts[key][0] += v["choice"] == "a"
            counts[key][1] += 1
        if settled(*counts[key], target_width, deff.get(key, 1.0)):
            still_open.discard(key)
        else:
            still_open.add(key)
        if not still_open and met_at is None:
            met_at = spent
    return {"target_width": target_width, "met_at_votes": met_at, "main_votes": spent,
            "open": [f"{q}: {a} vs {b}" for q, a, b in keys if (q, a, b) in still_open]}


class Allocator:
    """Live counts of a study's main votes per model pair and question, and the adaptive choice.

    Thread-safe: the server's request threads record votes and showings while others choose.
    """

    def __init__(self, model_pair_of: dict[str, ModelPair], questions: tuple[str, ...], target_width: float):
        self.model_pair_of, self.questions, self.target_width = model_pair_of, questions, target_width
        self.counts: dict[tuple[ModelPair, str], list[int]] = defaultdict(lambda: [0, 0, 0])  # wins_a, decisive, ties
        self.pending: Counter = Counter()  # model pair -> votes shown but not given yet
        self._keys = [(pair, q) for pair in dict.fromkeys(model_pair_of.values()) for q in questions]
        self._lock = threading.Lock()

    def load(self, rows: list[tuple[str, str, str, int]]) -> None:
        """Replace the counts with the store's (pair, question, choice, votes) rows."""
        counts: dict = defaultdict(lambda: [0, 0, 0])
        for pair_id, question, choice, n in rows:
            if pair_id in self.model_pair_of:
                c = counts[self.model_pair_of[pair_id], question]
                c[0] += n * (choice == "a")
                c[1] += n * is_decisive(choice)
                c[2] += n * (not is_decisive(choice))
        with self._lock:
            self.counts = counts

    def shown(self, pair_id: str) -> None:
        if pair_id in self.model_pair_of:
            with self._lock:
                self.pending[self.model_pair_of[pair_id]] += len(self.questions)

    def record(self, pair_id: str, question: str, choice: str) -> None:
        pair = self.model_pair_of.get(pair_id)
        if pair is None:
            return
        with self._lock:
            c = self.counts[pair, question]
            c[0] += choice == "a"
            c[1] += is_decisive(choice)
            c[2] += not is_decisive(choice)
            self.pending[pair] = max(0, self.pending[pair] - 1)

    def _score(self, pair: ModelPair) -> tuple[bool, float]:
        """(unsettled, priority) of a model pair: its least settled question."""
        scores = []
        for q in self.questions:
            wins, decisive, ties = self.counts.get((pair, q), (0, 0, 0))
            share = decisive / (decisive + ties) if decisive + ties else 1.0
            pending = self.pending[pair] / len(self.questions) * share
            scores.append((not settled(wins, decisive, self.target_width), priority(wins, decisive, self.target_width, pending)))
        return max(scores)

    def choose(self, candidates: list[ModelPair]) -> ModelPair:
        """The candidate that most needs votes: unsettled first, then the highest priority; ties go to the first."""
        with self._lock:
            best, best_score = candidates[0], self._score(candidates[0])
            for pair in candidates[1:]:
                score = self._score(pair)
                if score > best_score:
                    best, best_score = pair, score
        return best

    def all_settled(self) -> bool:
        with self._lock:
            return all(settled(*self.counts.get(key, (0, 0, 0))[:2], self.target_width) for key in self._keys)
