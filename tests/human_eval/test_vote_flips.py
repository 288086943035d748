"""The votes that would flip a preference: the count ``votes_to_flip`` gives equals trying every set of removed votes
on small vote sets (the design effect held), and results keep it with the votes it names."""
import itertools

from human_eval.statistics.stats import clustered_wilson_interval, vote_flip, votes_to_flip


def _by_every_subset(votes: list[int], deff: float) -> int | None:
    """The fewest votes (1 a win, 0 a loss) whose removal makes Wilson's interval on effective votes hold 50%."""
    def holds(rest):
        lo, hi = clustered_wilson_interval(sum(rest), len(rest), deff) if rest else (0.0, 1.0)
        return lo <= 0.5 <= hi
    for m in range(len(votes) + 1):
        if any(holds([v for i, v in enumerate(votes) if i not in gone])
               for gone in itertools.combinations(range(len(votes)), m)):
            return m or None
    return len(votes)


def test_the_count_equals_every_subset_tried():
    checked = 0
    for n in range(1, 13):
        for k in range(n + 1):
            for deff in (1.0, 1.7):
                assert votes_to_flip(k, n, deff) == _by_every_subset([1] * k + [0] * (n - k), deff), (k, n, deff)
                checked += votes_to_flip(k, n, deff) is not None
    assert checked > 20


def test_results_name_the_leading_sides_votes_on_its_most_won_prompts_first():
    leading = [{"pair_id": f"p{i}", "rater_id": f"r{i}"} for i in range(12)]
    prompts = [0, 1, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8]
    found = vote_flip(leading, prompts, 12, 12, 1.0)
    assert found["count"] == votes_to_flip(12, 12) and found["exact"]
    assert [v["pair_id"] for v in found["votes"][:3]] == ["p1", "p2", "p3"]  # prompt 1: won three times
    assert vote_flip(leading[:3], prompts[:3], 3, 6, 1.0) is None  # 3 of 6: cannot tell, nothing to flip
