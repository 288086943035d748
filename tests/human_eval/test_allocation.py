"""Adaptive allocation and the stopping rule, by simulation with raters of known preferences.

Four models: two close pairs (A-B, C-D, about 47.5% / 52.5%) and four far ones (about 22-25%). Each
showing asks both questions; 15% of answers are "no preference". The simulation drives the server's own
`Allocator` (adaptive) or picks model pairs at random (uniform, what random per-rater orders give), until
the stopping rule holds.
"""
import itertools
import math

import httpx
import numpy as np
import pytest

from human_eval.statistics.allocation import Allocator, settled, stopping_point, votes_to_settle
from human_eval.samples import read_manifest
from human_eval.statistics.stats import wilson_interval
from human_eval.study import build_study, load_study

from .conftest import Server, drawbench, start_rater, write_samples

STRENGTH = {"A": 0.0, "B": 0.1, "C": 1.2, "D": 1.3}
QUESTIONS = ("quality", "alignment")
TIES, TARGET = 0.15, 0.15
RUNS = {"adaptive": 30, "uniform": 15}  # uniform runs are 2.5x longer; 15 pin their mean within 2%


def true_preferences() -> dict[tuple[str, str], dict[str, float]]:
    """P(a preferred | decisive) per model pair and question (alignment follows the strengths less)."""
    return {(a, b): {"quality": 1 / (1 + math.exp(STRENGTH[b] - STRENGTH[a])),
                     "alignment": 1 / (1 + math.exp(0.8 * (STRENGTH[b] - STRENGTH[a])))}
            for a, b in itertools.combinations(STRENGTH, 2)}


def simulate(allocation: str, rng: np.random.Generator) -> tuple[int, list[bool]]:
    """Main votes until every comparison is settled, and whether each final interval holds the truth."""
    truth = true_preferences()
    pairs = list(truth)
    allocator = Allocator({f"{a}|{b}": (a, b) for a, b in pairs}, QUESTIONS, TARGET)
    spent = 0
    while not allocator.all_settled():
        if allocation == "adaptive":  # candidates in a random order, like a rater's own order
            pair = allocator.choose([pairs[i] for i in rng.permutation(len(pairs))])
        else:
            pair = pairs[rng.integers(len(pairs))]
        for q in QUESTIONS:
            choice = "none" if rng.random() < TIES else ("a" if rng.random() < truth[pair][q] else "b")
            allocator.record(f"{pair[0]}|{pair[1]}", q, choice)
            spent += 1
        assert spent < 20000
    covered = []
    for pair, q in itertools.product(pairs, QUESTIONS):
        wins, decisive, _ = allocator.counts[pair, q]
        lo, hi = wilson_interval(wins, decisive)
        covered.append(lo <= truth[pair][q] <= hi)
    return spent, covered


@pytest.fixture(scope="module")
def runs() -> dict[str, list[tuple[int, list[bool]]]]:
    rng = np.random.default_rng(2024)
    return {allocation: [simulate(allocation, rng) for _ in range(n)] for allocation, n in RUNS.items()}


def test_adaptive_reaches_the_target_with_at_least_a_quarter_fewer_votes(runs):
    mean = {a: np.mean([spent for spent, _ in r]) for a, r in runs.items()}
    assert mean["adaptive"] <= 0.75 * mean["uniform"], mean


def test_adaptive_intervals_cover_the_true_preferences_at_their_nominal_rate(runs):
    covered = [c for _, cs in runs["adaptive"] for c in cs]
    assert len(covered) == RUNS["adaptive"] * 12
    # 95% nominal; 360 intervals have a standard error of 1.1 points, so 3 of them below is 91.6%
    assert np.mean(covered) >= 0.916, np.mean(covered)


def test_the_planner_predicts_the_votes_it_takes(runs):
    comparisons = [{"model_a": a, "model_b": b, "rate_a": p[q], "tie_rate": TIES}
                   for (a, b), p in true_preferences().items() for q in QUESTIONS]
    predicted = votes_to_settle(comparisons, TARGET)
    for allocation, r in runs.items():
        spent = np.mean([s for s, _ in r])
        assert abs(predicted[allocation] - spent) <= 0.15 * spent, (allocation, predicted, spent)
    assert predicted["per_model_pair"]["A vs B"] > 5 * predicted["per_model_pair"]["A vs C"]  # close pairs cost most


def test_the_stopping_rule_reads_wilson_intervals():
    for n in range(1, 400, 7):
        for k in range(0, n + 1, max(1, n // 23)):
            lo, hi = wilson_interval(k, n)
            for width in (0.05, 0.1, 0.2):
                assert settled(k, n, width) == (lo > 0.5 or hi < 0.5 or hi - lo < width), (k, n, width)


def test_stopping_rule_and_its_replay():
    assert not settled(0, 0, 0.1)
    assert settled(27, 30, 0.1)  # [74.4, 96.5]: clear of 50% long before it is narrow
    assert not settled(110, 200, 0.1)  # [48.1, 61.7]: holds 50% and is 13.7 points wide
    assert settled(312, 600, 0.1) and settled(300, 600, 0.1)  # [48.0, 56.0] and [46.0, 54.0]: 8 points wide
    assert not settled(312, 600, 0.1, deff=2.0)  # clustered votes: sqrt(2) x 8 = 11.3 points
    pair_of = {"p1": ("x", "y")}
    votes = [{"pair_id": "p1", "question": q, "choice": "a"} for _ in range(12) for q in QUESTIONS]
    replay = stopping_point(votes + [{"pair_id": "gold", "question": "quality", "choice": "b"}], pair_of, QUESTIONS, 0.1)
    first = next(n for n in range(1, 13) if settled(n, n, 0.1))  # n wins of n decisive votes clear 50%
    assert replay["met_at_votes"] == 2 * first and replay["main_votes"] == 24 and replay["open"] == []
    assert stopping_point(votes[:4], pair_of, QUESTIONS, 0.1)["open"] == ["quality: x vs y", "alignment: x vs y"]


def test_adaptive_server_sends_showings_where_votes_are_needed(tmp_path):
    """Through the API: far model pairs settle and most later showings go to the close one."""
    prompts = drawbench(30)
    samples = []
    for i, name in enumerate(("strong", "weak1", "weak2")):
        samples += read_manifest(write_samples(tmp_path / name, name, prompts, 1, size=8, seed=i))
    build_study(samples, tmp_path / "study", allocation="adaptive", target_width=0.3, progress=False)
    study = load_study(tmp_path / "study")
    strong = study.models[0]
    tosses = {q: itertools.count() for q in QUESTIONS}  # per question: the weak two tie on each
    shown, firsts = [], []
    with Server(tmp_path / "study") as server, httpx.Client(base_url=server.url) as c:
        for r in range(4):
            rater = start_rater(c, f"sim{r}")
            positions: dict[tuple, list[int]] = {}
            for _ in range(15):
                p = c.get("/api/next", params={"rater": rater}).json()
                pair = study.by_id[p["pair"]]
                firsts += [] if positions else [pair.id]
                models = study.models_of(pair)
                shown.append(models)
                positions.setdefault(models, []).append(study.order_for(rater).index(pair.id))
                left = study.images[p["images"][0].removeprefix("/img/")].model
                for q in QUESTIONS:  # the strong model always wins; the weak two split their votes evenly
                    winner = strong if strong in models else models[next(tosses[q]) % 2]
                    prefer_left = left == winner
                    vote = c.post("/api/vote", json={"rater": rater, "pair": pair.id, "question": q,
                                                     "answer": "A" if prefer_left else "B"})
                    assert vote.json() == {"recorded": True}
            assert all(p == sorted(p) for p in positions.values())  # each model pair's pairs in the rater's own order
        # and those orders are each rater's own: raters start at different pairs (adaptive allocation sends each
        # rater's first showing to a model pair that needs votes, so two of four may start alike: one CI run saw 2)
        assert len(set(firsts)) >= 2
        results = c.get("/admin/results.json", headers={"Authorization": f"Bearer {server.token}"}).json()
    close = sum(strong not in m for m in shown[20:])  # after the first showings have settled the far pairs
    print("CLOSE", close)
    assert close / len(shown[20:]) > 0.6, close
    assert results["stopping"]["allocation"] == "adaptive" and results["stopping"]["main_votes"] == 2 * len(shown)
