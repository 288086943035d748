"""Coverage of the 95% intervals at their nominal level, simulated where the truth is known.

Win rates (``human_eval.statistics.stats``): n decisive votes (5, 10, 20, 50, 200) for a model whose true preference
rate is 0.5, 0.7 or 0.9, each vote by one of 10 raters. Without clustering every vote is on its own
prompt; with it, ``--votes-per-prompt`` votes share a prompt whose own rate is logistic(logit(rate) +
N(0, ``--prompt-sd``^2)), and the truth is the mean over prompts (Gauss-Hermite quadrature). Intervals:
Wilson on the effective number of votes (the report's default), Wilson, the two-way bootstrap and the
bootstrap by prompt; and how often each shrank to a single point.

Metrics (``evaluate.statistics.metrics`` and ``evaluate.statistics.bootstrap``, as a row and ``compare`` compute them):
``--images`` generated images of ``--dim``-dimensional Gaussian features against ``--reference`` fixed
reference features. FID and KID intervals cover the expected FID / KID at that number of images against
that reference (what the interval is for: generated images resampled, the reference fixed), estimated from
``--truth-draws`` independent sets; KID is also simulated for generated features drawn like the reference's
population, where its truth is 0 and its interval's lower bound is kept at 0. CLIP score: 100 x cos(image,
caption) of Gaussian embeddings, 2 images a prompt whose caption and strength they share, truth by Monte
Carlo; the paired difference of two checkpoints' CLIP scores (and of their FIDs) is compare's interval,
whose words must agree with its p-value in every draw.

Sizes (``--sizes-only`` runs these alone): per-image means and paired differences at 4, 8, 12, 20, 50 and 250
prompts x 1, 2 and 4 images a prompt x normal and skewed prompt effects, 1,000 draws a line, numpy over all draws
at once: the t-interval on per-prompt contributions (the workbench's rule at every size) and the percentile
bootstrap (its rule from 100 prompts on before), a line outside 93-97% drawn again on 4,000 fresh draws; FID and
KID of 2 images a prompt at the same prompt counts, each alone and as compare's paired difference B - A of two
checkpoints drawn on the same prompts (``--set`` runs these set-metric tables alone).

  python bench/coverage.py --sizes-only                         # 24 minutes on 2 cores at load average 1-11
  python bench/coverage.py --set                                # the set-metric tables alone
  python bench/coverage.py [--sims 1000 --metric-sims 400]      # about 8 minutes on 2 busy cores, and the sizes
  python bench/coverage.py --smoke                              # seconds: a few draws of small cases

Writes OUT/coverage.json (default bench/out) and prints the tables as Markdown before it.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from _common import parse_args, report

LEVEL = 0.95
VOTES, RATES = (5, 10, 20, 50, 200), (0.5, 0.7, 0.9)
WIN_INTERVALS = ("clustered_wilson", "wilson", "two_way", "bootstrap_prompt")


def truth_of_rate(rate: float, prompt_sd: float) -> float:
    """E over prompts of logistic(logit(rate) + prompt_sd Z): the share a model wins across the prompt population."""
    if prompt_sd == 0:
        return rate
    z, w = np.polynomial.hermite_e.hermegauss(80)
    logit = np.log(rate / (1 - rate))
    return float((w * 1 / (1 + np.exp(-(logit + prompt_sd * z)))).sum() / w.sum())


def simulated_votes(rng, n: int, rate: float, per_prompt: int, prompt_sd: float):
    """(wins, prompts, raters) of n decisive votes; per_prompt 1 means independent votes."""
    prompts = np.arange(n) // per_prompt
    logit = np.log(rate / (1 - rate)) + prompt_sd * rng.standard_normal(prompts.max() + 1)[prompts]
    wins = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(float)
    return wins, prompts, rng.integers(0, 10, n)


def win_rate_intervals(wins, prompts, raters, n_boot: int, rng) -> dict[str, tuple[float, float]]:
    from human_eval.statistics.stats import (bootstrap_rate, clustered_wilson_interval, design_effect, percentile_interval,
                                  two_way_interval, two_way_variance, wilson_interval)

    ones, k, n = np.ones_like(wins), wins.sum(), len(wins)
    variance = two_way_variance(wins, ones, prompts, raters, n_boot, rng)
    return {"clustered_wilson": clustered_wilson_interval(k, n, design_effect(k, n, variance)),
            "wilson": wilson_interval(k, n),
            "two_way": two_way_interval(wins, ones, prompts, raters, variance=variance),
            "bootstrap_prompt": percentile_interval(bootstrap_rate(wins, ones, prompts, n_boot, rng))}


def win_rate_coverage(sims: int, n_boot: int, per_prompt: int, prompt_sd: float, votes, rates, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for clustered in (False, True):
        for n in votes:
            for rate in rates:
                sd, step = (prompt_sd, per_prompt) if clustered else (0.0, 1)
                truth = truth_of_rate(rate, sd)
                covered = dict.fromkeys(WIN_INTERVALS, 0)
                point = dict.fromkeys(WIN_INTERVALS, 0)
                for _ in range(sims):
                    votes_drawn = simulated_votes(rng, n, rate, step, sd)
                    for name, (lo, hi) in win_rate_intervals(*votes_drawn, n_boot, rng).items():
                        covered[name] += lo <= truth <= hi
                        point[name] += hi - lo < 1e-12
                rows.append({"votes": n, "rate": rate, "clustered": clustered, "prompts": -(-n // step),
                             "truth": round(truth, 4), "coverage": {k: covered[k] / sims for k in WIN_INTERVALS},
                             "zero_width": {k: point[k] / sims for k in WIN_INTERVALS}})
    return rows


class Gaussians:
    """Generated features N(shift, scale^2 I) against a fixed reference sample of N(0, I)."""

    def __init__(self, rng, dim: int, reference: int):
        import torch

        from evaluate.statistics.metrics import FeatureStats, FrechetReference

        self.rng, self.dim = rng, dim
        self.real = torch.from_numpy(rng.standard_normal((reference, dim)))
        stats = FeatureStats(dim, kid_max=reference)
        stats.update(self.real)
        self.frechet = FrechetReference.from_stats(stats)

    def draw(self, n: int, shift: float, scale: float):
        import torch

        return torch.from_numpy(self.rng.standard_normal((n, self.dim)) * scale + shift)

    def metric(self, name: str, x, weights: np.ndarray) -> np.ndarray:
        from evaluate.statistics.metrics import kid_replicates

        return self.frechet.replicates(x, weights) if name == "fid" else kid_replicates(self.real, x, weights)


def set_metric_coverage(g: Gaussians, name: str, shift: float, scale: float, images: int, replicates: int,
                        sims: int, truth_draws: int, truth: float | None = None, per_prompt: int = 1) -> dict:
    """One set metric's interval (``bootstrap.interval`` with its range) against ``truth``, by default E[metric at
    this N | reference] from ``truth_draws`` sets. KID is the full set's unbiased estimate (a row's point averages
    subsets of it); its replicates are a row's."""
    from evaluate.statistics.bootstrap import interval, prompt_weights
    from evaluate.names import value_range

    ones = np.ones((1, images))
    if truth is None:
        truth = float(np.mean([g.metric(name, g.draw(images, shift, scale), ones)[0] for _ in range(truth_draws)]))
    covered = zero = clipped = 0
    widths = []
    for i in range(sims):
        x = g.draw(images, shift, scale)
        reps = g.metric(name, x, prompt_weights(np.arange(images) // per_prompt, replicates, seed=i))
        point = g.metric(name, x, ones)[0]
        lo, hi = interval(point, reps, bounds=value_range(name))
        raw_lo, _ = interval(point, reps)
        covered += lo <= truth <= hi
        zero += lo <= 0 <= hi
        clipped += raw_lo < lo
        widths.append(hi - lo)
    return {"metric": {"fid": "FID", "kid_mean": "KID"}[name], "case": f"shift {shift:g}, scale {scale:g}",
            "truth": truth, "coverage": covered / sims, "covers_zero": zero / sims,
            "lower_bound_raised_to_0": clipped / sims, "mean_width": float(np.mean(widths))}


def clip_scores(rng, prompts: int, strength: np.ndarray, dim: int = 32,
                per_prompt: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """100 x cos(image, caption): each prompt's caption t and strength a; an image is a t + N(0, I). Returns
    (scores, prompt ids)."""
    t = rng.standard_normal((prompts, dim))
    ids = np.repeat(np.arange(prompts), per_prompt)
    images = strength[ids, None] * t[ids] + rng.standard_normal((len(ids), dim))
    cos = (images * t[ids]).sum(1) / np.linalg.norm(images, axis=1) / np.linalg.norm(t[ids], axis=1)
    return 100 * cos, ids


def clip_coverage(rng, prompts: int, replicates: int, sims: int, gain: float) -> tuple[dict, dict]:
    """CLIP score's interval (prompts resampled) and compare's paired interval of B - A, with B's strength higher
    by ``gain``; truths by Monte Carlo over 200,000 prompts."""
    from evaluate.statistics.bootstrap import interval, p_value, prompt_weights, weighted_means

    def strength(n: int) -> np.ndarray:
        return np.clip(0.35 + 0.15 * rng.standard_normal(n), 0, None)  # prompts differ: clustering

    big = strength(200_000)
    truth_a = float(clip_scores(rng, 200_000, big)[0].mean())
    truth_b = float(clip_scores(rng, 200_000, big + gain)[0].mean())
    single = paired = agree = 0
    for i in range(sims):
        s = strength(prompts)
        a, ids = clip_scores(rng, prompts, s)
        b, _ = clip_scores(rng, prompts, s + gain)
        w = prompt_weights(ids, replicates, seed=i)
        ra, rb = weighted_means(a, w), weighted_means(b, w)
        lo, hi = interval(a.mean(), ra, bounds=(-100, 100))
        single += lo <= truth_a <= hi
        d = b.mean() - a.mean()
        lo, hi = interval(d, rb - ra)
        paired += lo <= truth_b - truth_a <= hi
        agree += (lo > 0 or hi < 0) == (p_value(d, rb - ra) < 0.05)
    return ({"metric": "CLIP score", "case": f"{prompts} prompts x 2 images", "truth": truth_a,
             "coverage": single / sims},
            {"metric": "CLIP score, B - A (compare)", "case": f"strength +{gain:g}", "truth": truth_b - truth_a,
             "coverage": paired / sims, "verdict_agrees_with_p": agree / sims})


def fid_difference_coverage(g: Gaussians, images: int, replicates: int, sims: int, truth_draws: int) -> dict:
    """compare's paired interval of FID_B - FID_A (one draw of prompts for both sets) against E[FID_B] - E[FID_A]."""
    from evaluate.statistics.bootstrap import interval, p_value, prompt_weights

    ones = np.ones((1, images))
    cases = {"a": (0.2, 1.1), "b": (0.1, 1.05)}
    truth = {k: float(np.mean([g.metric("fid", g.draw(images, *c), ones)[0] for _ in range(truth_draws)]))
             for k, c in cases.items()}
    covered = agree = 0
    for i in range(sims):
        xa, xb = g.draw(images, *cases["a"]), g.draw(images, *cases["b"])
        w = prompt_weights(np.arange(images), replicates, seed=i)
        reps = g.metric("fid", xb, w) - g.metric("fid", xa, w)
        d = float(g.metric("fid", xb, ones)[0] - g.metric("fid", xa, ones)[0])
        lo, hi = interval(d, reps)
        covered += lo <= truth["b"] - truth["a"] <= hi
        agree += (lo > 0 or hi < 0) == (p_value(d, reps) < 0.05)
    return {"metric": "FID, B - A (compare)", "case": "shift 0.2 -> 0.1, scale 1.1 -> 1.05",
            "truth": truth["b"] - truth["a"], "coverage": covered / sims, "verdict_agrees_with_p": agree / sims}


SIZES, PER_PROMPT, EFFECTS = (4, 8, 12, 20, 50, 250), (1, 2, 4), ("normal", "skewed")


def prompt_effects(rng, shape: tuple, effect: str) -> np.ndarray:
    """Per-prompt effects of mean 0 and sd 1: normal, or skewed (an exponential less 1: skewness 2, a few prompts
    far above the rest, as a gain that holds on a handful of captions)."""
    return rng.standard_normal(shape) if effect == "normal" else rng.exponential(1.0, shape) - 1.0


def mean_lines(rng, draws: int, prompts: int, per_prompt: int, effect: str, replicates: int) -> dict:
    """One line of the size table, ``draws`` at once: a per-image mean (one checkpoint's; truth 0) and a paired
    difference B - A (A's per-prompt difficulty shared, B's gain per prompt drawn; truth 0.3), each image with noise
    of sd 1. Coverage of the t-interval on per-prompt means (``bootstrap.t_interval``: with as many images on every
    prompt, ``prompt_contributions`` are those means) and of the percentile bootstrap over prompts
    (``bootstrap.interval``, the rule at 100 prompts and more before the t-interval became the rule at every size).
    The first draw of each line is checked against ``bootstrap.mean_interval`` itself."""
    from scipy import stats

    from evaluate.statistics.bootstrap import mean_interval, prompt_weights, weighted_means

    shape = (draws, prompts, per_prompt)
    single = prompt_effects(rng, shape[:2], effect)[:, :, None] + rng.standard_normal(shape)
    difficulty = 3.0 * rng.standard_normal(shape[:2])[:, :, None]
    a = difficulty + rng.standard_normal(shape)
    b = difficulty + 0.3 + prompt_effects(rng, shape[:2], effect)[:, :, None] + rng.standard_normal(shape)
    line = {"prompts": prompts, "per_prompt": per_prompt, "effect": effect}
    t_crit = stats.t.ppf(1 - (1 - LEVEL) / 2, prompts - 1)
    for name, values, truth, base in (("mean", single, 0.0, None), ("difference", b - a, 0.3, (a, b))):
        c = values.mean(2)  # (draws, prompts): each prompt's mean
        mean, se = c.mean(1), c.std(1, ddof=1) / np.sqrt(prompts)
        t_cover = np.abs(mean - truth) <= t_crit * se
        counts = rng.multinomial(prompts, np.full(prompts, 1.0 / prompts), size=(draws, replicates))
        reps = np.einsum("drp,dp->dr", counts, c) / prompts  # equal images per prompt: the weighted image mean
        low, high = np.quantile(reps - reps.mean(1, keepdims=True), [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=1)
        p_cover = (mean + low <= truth) & (truth <= mean + high)
        ids = np.repeat(np.arange(prompts), per_prompt)
        first = values[0].ravel() if base is None else base[1][0].ravel()
        w = prompt_weights(ids, replicates, seed=0)
        rep0 = weighted_means(first, w) - (0 if base is None else weighted_means(base[0][0].ravel(), w))
        got = mean_interval(ids, first, None if base is None else base[0][0].ravel(), rep0)
        if got["rule"] != "t" or not np.allclose([got["lo"], got["hi"]], [mean[0] - t_crit * se[0],
                                                                           mean[0] + t_crit * se[0]]):
            raise SystemExit(f"coverage: check failed: the t-interval of {name} differs from mean_interval's")
        line[name] = {"t": float(t_cover.mean()), "percentile": float(p_cover.mean()),
                      "width_t": float(np.median(2 * t_crit * se))}
    return line


def mean_line(rng, draws: int, prompts: int, per_prompt: int, effect: str, replicates: int) -> dict:
    """``mean_lines`` of ``draws``, drawn in chunks: 250 draws x 200 replicates x 250 prompts of int64 counts is
    100 MB."""
    chunk = 250
    sizes = [min(chunk, draws - i) for i in range(0, draws, chunk)]
    parts = [mean_lines(rng, n, prompts, per_prompt, effect, replicates) for n in sizes]
    line = {**parts[0], "draws": draws}
    for name in ("mean", "difference"):
        line[name] = {k: float(np.average([q[name][k] for q in parts], weights=sizes)) for k in parts[0][name]}
    return line


BAND = (0.93, 0.97)  # a line's t-interval coverage outside it is drawn again, AGAIN times as many fresh draws
AGAIN = 4


def mean_size_table(rng, draws: int, replicates: int, sizes=SIZES, again=None) -> list[dict]:
    """Every line of the size table; with ``again`` (a second generator), a line whose t-interval covered outside
    ``BAND`` on either figure is measured once more on ``AGAIN`` x ``draws`` fresh draws (``again`` in the line):
    with 1,000 draws one standard error is 0.7 points, so 72 cells at a true 95% have one outside the band by chance
    about one run in four; 4,000 draws tell such a cell from a rule that covers less."""
    lines = []
    for prompts in sizes:
        for per_prompt in PER_PROMPT:
            for effect in EFFECTS:
                line = mean_line(rng, draws, prompts, per_prompt, effect, replicates)
                if again is not None and any(not BAND[0] <= line[n]["t"] <= BAND[1] for n in ("mean", "difference")):
                    line["again"] = mean_line(again, AGAIN * draws, prompts, per_prompt, effect, replicates)
                lines.append(line)
    return lines


def set_size_table(g: "Gaussians", sims: int, replicates: int, truth_draws: int, sizes=SIZES,
                   per_prompt: int = 2) -> list[dict]:
    """FID and KID of ``per_prompt`` images a prompt at each size: their interval's coverage of E[metric at that
    size], as ``set_metric_coverage`` measures it (its prompts resampled as a row's are)."""
    lines = []
    for prompts in sizes:
        images = prompts * per_prompt
        for name in ("fid", "kid_mean"):
            found = set_metric_coverage(g, name, 0.2, 1.1, images, replicates, sims, truth_draws, per_prompt=per_prompt)
            lines.append({"prompts": prompts, "per_prompt": per_prompt, **found})
    return lines


# (shift, scale) of A's and of B's generated features: B nearer the reference, and the two alike (truth 0 exactly)
SET_CASES = {"B nearer": ((0.2, 1.1), (0.1, 1.05)), "alike": ((0.2, 1.1), (0.2, 1.1))}


def paired_sets(g: "Gaussians", prompts: int, per_prompt: int, case: str):
    """(A's features, B's features, prompt ids) of two checkpoints drawn on the same prompts and seeds: each prompt's
    effect (N(0, 0.5^2 I)) is shared, and so is half the variance of each image's seed noise; each side is its shift
    plus its scale times unit-variance features, so A and B alike are exchangeable."""
    import torch

    (shift_a, scale_a), (shift_b, scale_b) = SET_CASES[case]
    ids = np.repeat(np.arange(prompts), per_prompt)
    prompt = 0.5 * g.rng.standard_normal((prompts, g.dim))[ids]
    seed, own = g.rng.standard_normal((2, len(ids), g.dim))
    za = (prompt + seed) / np.sqrt(1.25)
    zb = (prompt + np.sqrt(0.5) * (seed + own)) / np.sqrt(1.25)
    return torch.from_numpy(za * scale_a + shift_a), torch.from_numpy(zb * scale_b + shift_b), ids


def set_difference_coverage(g: "Gaussians", name: str, case: str, prompts: int, per_prompt: int, replicates: int,
                            sims: int, truth_draws: int) -> dict:
    """compare's paired interval of a set metric's B - A (``bootstrap.interval`` on the paired replicates, with the
    difference's range; one draw of prompt weights for both sides) against E[B - A] at this size, the mean of
    ``truth_draws`` paired draws (0 for "alike"); how often it holds 0, and whether its words agree with its p."""
    from evaluate.names import difference_range
    from evaluate.statistics.bootstrap import interval, p_value, prompt_weights

    ones = np.ones((1, prompts * per_prompt))

    def difference(xa, xb, weights: np.ndarray) -> np.ndarray:
        return g.metric(name, xb, weights) - g.metric(name, xa, weights)

    truth = 0.0 if case == "alike" else float(np.mean(
        [difference(*paired_sets(g, prompts, per_prompt, case)[:2], ones)[0] for _ in range(truth_draws)]))
    covered = zero = agree = 0
    for i in range(sims):
        xa, xb, ids = paired_sets(g, prompts, per_prompt, case)
        reps = difference(xa, xb, prompt_weights(ids, replicates, seed=i))
        d = float(difference(xa, xb, ones)[0])
        lo, hi = interval(d, reps, bounds=difference_range(name))
        covered += lo <= truth <= hi
        zero += lo <= 0 <= hi
        agree += (lo > 0 or hi < 0) == (p_value(d, reps) < 0.05)
    return {"prompts": prompts, "per_prompt": per_prompt, "metric": {"fid": "FID", "kid_mean": "KID"}[name],
            "case": case, "truth": truth, "coverage": covered / sims, "covers_zero": zero / sims,
            "verdict_agrees_with_p": agree / sims}


def set_difference_size_table(g: "Gaussians", sims: int, replicates: int, truth_draws: int, sizes=SIZES,
                              per_prompt: int = 2) -> list[dict]:
    return [set_difference_coverage(g, name, case, prompts, per_prompt, replicates, sims, truth_draws)
            for prompts in sizes for name in ("fid", "kid_mean") for case in SET_CASES]


def set_difference_markdown(lines: list[dict]) -> str:
    rows = ["| prompts | images | metric | case | coverage % | interval holds 0 % |", "|---|---|---|---|---|---|"]
    rows += [f"| {r['prompts']} | {r['prompts'] * r['per_prompt']} | {r['metric']} B - A | {r['case']} | "
             f"{100 * r['coverage']:.1f} | {100 * r['covers_zero']:.1f} |" for r in lines]
    return "\n".join(rows)


def size_markdown(means: list[dict], sets: list[dict]) -> str:
    lines = ["| prompts | images a prompt | prompt effects | mean: t | mean: percentile | B - A: t | "
             f"B - A: percentile | t again, {AGAIN}x fresh draws (mean, B - A) |", "|---|---|---|---|---|---|---|---|"]
    for r in means:
        again = f"{100 * r['again']['mean']['t']:.1f}, {100 * r['again']['difference']['t']:.1f}" if "again" in r else ""
        lines.append(f"| {r['prompts']} | {r['per_prompt']} | {r['effect']} | "
                     + " | ".join(f"{100 * r[n][k]:.1f}" for n in ("mean", "difference") for k in ("t", "percentile"))
                     + f" | {again} |")
    lines += ["", "| prompts | images | metric | coverage % | interval holds 0 % |", "|---|---|---|---|---|"]
    lines += [f"| {r['prompts']} | {r['prompts'] * r['per_prompt']} | {r['metric']} | {100 * r['coverage']:.1f} | "
              f"{100 * r['covers_zero']:.1f} |" for r in sets]
    return "\n".join(lines)


def markdown(win_rates: list[dict], metrics: list[dict]) -> str:
    head = "| votes | prompts | true rate | " + " | ".join(WIN_INTERVALS) + " |"
    lines = [head, "|" + "---|" * (3 + len(WIN_INTERVALS))]
    for r in win_rates:
        cells = [f"{100 * r['coverage'][k]:.1f}" + (f" ({100 * r['zero_width'][k]:.0f}% a point)" if r["zero_width"][k]
                                                    else "") for k in WIN_INTERVALS]
        lines.append(f"| {r['votes']} | {r['prompts'] if r['clustered'] else 'own each'} | {r['truth']:.3f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| metric | case | truth | coverage % |", "|---|---|---|---|"]
    lines += [f"| {m['metric']} | {m['case']} | {m['truth']:.4g} | {100 * m['coverage']:.1f} |" for m in metrics]
    return "\n".join(lines)


def size_tables(args: argparse.Namespace) -> dict:
    """The size tables (``--set``: the set metrics' alone), printed as Markdown; their seconds."""
    t = time.perf_counter()
    sizes = (4, 20) if args.smoke else SIZES
    means = ([] if args.set else mean_size_table(np.random.default_rng(args.seed + 2), args.size_draws,
                                                 args.replicates, sizes, np.random.default_rng(args.seed + 5)))
    sets = set_size_table(Gaussians(np.random.default_rng(args.seed + 3), args.dim, args.reference),
                          args.set_size_sims, args.replicates, args.truth_draws, sizes)
    differences = set_difference_size_table(Gaussians(np.random.default_rng(args.seed + 4), args.dim, args.reference),
                                            args.set_difference_sims, args.replicates, args.truth_draws, sizes)
    if any(r["verdict_agrees_with_p"] != 1.0 for r in differences):
        raise SystemExit("coverage: check failed: a set metric's paired interval and p-value disagreed")
    print(size_markdown(means, sets), set_difference_markdown(differences), sep="\n\n")
    return {"means_by_size": means, "sets_by_size": sets, "set_differences_by_size": differences,
            "seconds_sizes": round(time.perf_counter() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1000, help="draws per win-rate case")
    ap.add_argument("--bootstrap", type=int, default=500, help="bootstrap resamples for the win-rate intervals")
    ap.add_argument("--votes-per-prompt", type=int, default=5)
    ap.add_argument("--prompt-sd", type=float, default=1.0, help="spread of the prompts' rates, on the logit scale")
    ap.add_argument("--metric-sims", type=int, default=400, help="draws per metric case")
    ap.add_argument("--truth-draws", type=int, default=2000, help="sets whose mean is a set metric's truth")
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--reference", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--replicates", type=int, default=200,
                    help="replicates of a metric's interval (evaluate's default)")
    ap.add_argument("--prompts", type=int, default=250, help="prompts of a CLIP-score row (2 images each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size-draws", type=int, default=1000, help="draws per line of the per-image mean size table")
    ap.add_argument("--set-size-sims", type=int, default=200, help="draws per line of the set-metric size table")
    ap.add_argument("--set-difference-sims", type=int, default=200,
                    help="draws per line of the set metrics' paired-difference size table")
    ap.add_argument("--sizes-only", action="store_true", help="only the size tables (per-image means, set metrics)")
    ap.add_argument("--set", action="store_true", help="only the set metrics' size tables (each alone, and B - A)")
    args = parse_args(ap, smoke=dict(sims=10, bootstrap=50, metric_sims=4, truth_draws=20, images=40, reference=60,
                                     dim=4, replicates=40, prompts=30, size_draws=20, set_size_sims=4,
                                     set_difference_sims=4))
    import torch

    torch.set_num_threads(1)  # small matrices: one thread is several times faster on a busy 2-core machine
    t = time.perf_counter()
    sized = size_tables(args)
    if args.sizes_only or args.set:
        report("coverage", {"level": LEVEL, "settings": {k: v for k, v in vars(args).items() if k != "out"}, **sized})
        return
    votes, rates = ((5, 50), (0.7,)) if args.smoke else (VOTES, RATES)
    win_rates = win_rate_coverage(args.sims, args.bootstrap, args.votes_per_prompt, args.prompt_sd, votes, rates,
                                  args.seed)
    seconds_votes = time.perf_counter() - t
    rng = np.random.default_rng(args.seed + 1)
    g = Gaussians(rng, args.dim, args.reference)
    metrics = [set_metric_coverage(g, name, 0.2, 1.1, args.images, args.replicates, args.metric_sims, args.truth_draws)
               for name in ("fid", "kid_mean")]
    # generated features drawn like the reference's: KID's truth is 0, where its interval's lower bound is kept
    metrics += [set_metric_coverage(g, "kid_mean", 0.0, 1.0, args.images, args.replicates, args.metric_sims, 0, 0.0)]
    metrics += [fid_difference_coverage(g, args.images, args.replicates, args.metric_sims, args.truth_draws)]
    metrics += list(clip_coverage(rng, args.prompts, args.replicates, args.metric_sims, gain=0.01))
    for m in metrics:
        if m.get("verdict_agrees_with_p", 1.0) != 1.0:
            raise SystemExit(f"coverage: check failed: {m['metric']}'s interval and p-value disagreed")
    print(markdown(win_rates, metrics))
    report("coverage", {"level": LEVEL, "settings": {k: v for k, v in vars(args).items() if k != "out"},
                        "seconds": {"win_rates": round(seconds_votes, 1), "all": round(time.perf_counter() - t, 1)},
                        "win_rates": win_rates, "metrics": metrics, **sized})


if __name__ == "__main__":
    main()
