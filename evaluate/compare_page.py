"""The comparison page: what `dwb evaluate compare A B` found, and the images behind it, on one HTML page.

``OUT/compare/<A>-vs-<B>.html`` (``layout.comparison_page``) has one section per guidance scale (and sampler)
of the comparison. Each names what was scored (weights, sampler, steps, guidance), then gives each family's
verdict after Holm's adjustment (the comparison's ``overall``), with studies of the same checkpoints the raters'
preference with its interval from the study's report, and the verdict table: per metric, A, B, the difference
B - A with its paired 95% interval, the p its verdict rests on (Holm-adjusted within its family), its own p, the
verdict and the sentence, each printed by ``verdict.py`` exactly as `dwb evaluate compare` prints it, the row
coloured by the adjusted verdict. Then A's and B's images of the same prompt and seed side by side: pairs
raters voted on first, then those whose per-image scores differ most (``pair_order``), each captioned with its
prompt, seed and per-image scores and how many raters preferred A, B or neither on it (``study_votes``).

The page embeds nothing: it links the sample PNGs relative to itself, so a copy of OUT keeps it whole, and
shows at most ``MAX_PAIRS`` pairs per section (``--max-pairs``), each image at its own size within
``SHOWN_SIZE``. Every text on it is escaped (prompts come from users).
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from models.common import interval_text, p_value_text, write_text_whole

from .attribute_accuracy import PREFIX, VERDICTS
from .compare import rows_of
from .layout import comparison_page
from .samples import MANIFEST, read_manifest
from .store import ResultsStore
from .study_votes import CHOICES, Counts, StudyVotes, check_studies, pair_votes, raters_preference
from .verdict import flip_shown, interval_shown, own_p_shown, p_shown, replicates_text, scored_text, verdict_shown

MAX_PAIRS = 48  # image pairs shown per guidance scale
SHOWN_SIZE = (128, 256)  # an image is shown at its own side, enlarged to the first or shrunk to the second
PER_IMAGE_SCORES = ("clip_score", *(PREFIX + v for v in VERDICTS))  # manifest keys, as the manifest names them
ORDER_SCORES = (PREFIX + "all", "clip_score")  # what orders the pairs: every attribute right, then CLIP score

STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222}small{color:#555}
table.verdict td,table.verdict th{padding:3px 8px;text-align:right;font-size:13px;white-space:nowrap}
table.verdict .sentence{text-align:left;white-space:normal}tr.better-B{background:#e6f4e6}
tr.better-A{background:#fbeaea}p.verdict{font-size:1.1em;font-weight:bold;margin-bottom:.2em}
div.overall ul,div.raters ul{margin-top:0}
div.pairs{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
figure.pair{margin:0;padding:8px;border:1px solid #ccc;border-radius:6px;width:min-content}
div.sides{display:flex;gap:8px}div.side{text-align:center;font-size:12px}
div.side img{image-rendering:pixelated;display:block}figcaption{font-size:12px;margin-top:6px}
p.prompt{font-size:14px;margin:2px 0;white-space:pre-wrap;overflow-wrap:anywhere}
table.votes{font-size:12px;border-collapse:collapse}table.votes td,table.votes th{border:1px solid #ddd;padding:1px 6px}"""


def _text(value) -> str:
    """Escaped for HTML text and for an attribute value in quotes (either kind)."""
    return html.escape(str(value), quote=True)


def _real(value) -> float | None:
    """``value`` as a float where it is a number (a verdict counts 1 when right), else None."""
    return float(value) if isinstance(value, (int, float)) else None


def _number(value, spec: str = ".4g") -> str:
    """A number in ``spec``; a verdict as a check mark or a cross; anything else escaped as text."""
    if isinstance(value, bool):
        return "&#10003;" if value else "&#10007;"  # a check mark or a cross
    if isinstance(value, float) or (spec != ".4g" and isinstance(value, int)):
        return format(value, spec)
    return _text(value)


@dataclass(frozen=True)
class ImagePair:
    """One prompt and seed: A's manifest line and B's, and their sample folders."""

    a: dict
    b: dict
    folder_a: Path
    folder_b: Path

    @property
    def key(self) -> tuple[str, int, int]:
        """(prompt set, prompt index, image index): what a study's pair is joined on."""
        return self.a.get("prompt_set") or "", self.a["prompt_index"], self.a["image_index"]

    def difference(self, score: str) -> float | None:
        """B's per-image ``score`` minus A's (a verdict counts 1 when right), None where either lacks it."""
        va, vb = _real(self.a.get(score)), _real(self.b.get(score))
        return None if va is None or vb is None else vb - va


def image_pairs(out: Path, row_a: dict, row_b: dict) -> list[ImagePair]:
    """A's and B's images of the same prompt, image index and seed, from the two rows' manifests."""
    folder_a, folder_b = out / row_a["samples"], out / row_b["samples"]
    lines_b = {(m["prompt_index"], m["image_index"]): m for m in read_manifest(folder_b / MANIFEST)}
    pairs = []
    for m in read_manifest(folder_a / MANIFEST):
        other = lines_b.get((m["prompt_index"], m["image_index"]))
        if other is not None and other["seed"] == m["seed"]:
            pairs.append(ImagePair(m, other, folder_a, folder_b))
    return pairs


def order_scores(pairs: list[ImagePair]) -> list[str]:
    """The scores of ``ORDER_SCORES`` some pair has for both images."""
    return [s for s in ORDER_SCORES if any(p.difference(s) is not None for p in pairs)]


def pair_order(pairs: list[ImagePair]) -> list[ImagePair]:
    """Largest absolute per-image difference first, in ``order_scores`` order; then prompt and image index."""
    scores = order_scores(pairs)
    return sorted(pairs, key=lambda p: (*(-abs(p.difference(s) or 0.0) for s in scores),
                                        p.a["prompt_index"], p.a["image_index"]))


def order_sentence(pairs: list[ImagePair]) -> str:
    scores = order_scores(pairs)
    if not scores:
        return "Pairs in prompt order (the images have no per-image scores)."
    by = ", then ".join(f"|B - A| of {s}" for s in scores)
    return f"Pairs where A's and B's images differ most first: by {by} (largest first), then in prompt order."


VERDICT_COLUMNS = ("metric", "A", "B", "B - A [95% interval]", "prompts that would flip it", "p, Holm-adjusted",
                   "its own p", "verdict")


def overall_part(result: dict) -> str:
    """Each family's verdict after Holm's adjustment, the lines `dwb evaluate compare` prints under its heading."""
    verdict = result.get("overall") or {}
    lines = "".join(f"<li class='family' data-family='{_text(f.get('family', ''))}'>{_text(f['sentence'])}</li>"
                    for f in verdict.get("families", []))
    return (f"<div class='overall'><p class='verdict'>verdict per family of metrics, after Holm's adjustment within "
            f"each:</p><ul>{lines}</ul></div>" if verdict else "")


def verdict_row(m: dict) -> str:
    """One metric: A, B, B - A with its interval, the p its verdict rests on (after Holm's adjustment within its
    family), its own p, the verdict and the sentence, each printed by ``verdict.py`` as `compare` prints it."""
    cells = ((m.get("name") or m["metric"], "name"), (_number(m["a"]), None), (_number(m["b"]), None),
             (interval_shown(m), "interval"), (flip_shown(m), "flip"), (p_shown(m), "p"), (own_p_shown(m), "own-p"),
             (verdict_shown(m), "verdict"), (m["sentence"], "sentence"))
    tds = "".join(f"<td class='{kind}'>{_text(value)}</td>" if kind else f"<td>{value}</td>" for value, kind in cells)
    return f"<tr class='better-{_text(m.get('better_holm') or 'none')}' data-metric='{_text(m['metric'])}'>{tds}</tr>"


def verdict_table(result: dict) -> str:
    """The comparison's verdict per family and one table row per metric; a row's colour is its verdict after Holm's
    adjustment within its family, the verdict its sentence leads with."""
    head = "".join(f"<th>{h}</th>" for h in VERDICT_COLUMNS) + "<th class='sentence'>in words</th>"
    rows = "".join(verdict_row(m) for m in result["metrics"])
    return f"{overall_part(result)}<table class='verdict'><tr>{head}</tr>{rows}</table>"


def preference_text(pref: dict) -> str:
    """The raters' preference in `dwb human-eval report`'s words and digits: the preferred side first, its share of
    the decisive votes with the 95% interval (Wilson on effective votes) and the score test's p."""
    if pref["rate_a"] is None or pref["lo"] is None:
        return f"{pref['question']}: no decisive votes ({pref['votes']} votes)"
    flip = pref["rate_a"] < 0.5  # the winner first, as the report writes it
    first = {"A": "B", "B": "A"}[pref["model_a"]] if flip else pref["model_a"]
    rate, lo, hi = ((1 - pref["rate_a"], 1 - pref["hi"], 1 - pref["lo"]) if flip
                    else (pref["rate_a"], pref["lo"], pref["hi"]))
    said = f"{first} is preferred" if lo > 0.5 or hi < 0.5 else "cannot tell yet (the interval holds 50%)"
    p = "" if pref["p"] is None else f", {p_value_text(pref['p'])}"
    return (f"{pref['question']}: {said}: {first}'s share of {pref['decisive']} decisive votes "
            f"{interval_text(100 * rate, 100 * lo, 100 * hi, threshold=50)}% (95%, Wilson on effective votes){p}")


def raters_part(preferences: list[dict]) -> str:
    """Beside the metrics' verdict: what the raters preferred, per study and question, from the study's report."""
    if not preferences:
        return ""
    items = "".join(f"<li class='preference' data-question='{_text(p['question'])}'>{_text(preference_text(p))} "
                    f"<small>(study folder {_text(p['study'])})</small></li>" for p in preferences)
    return (f"<div class='raters'><p class='verdict'>raters' preference, the same checkpoints and settings (`dwb "
            f"human-eval report`):</p><ul>{items}</ul></div>")


def _shown_size(line: dict) -> tuple[int, int]:
    low, high = SHOWN_SIZE
    width, height = (_real(line.get(side)) or high for side in ("width", "height"))
    scale = min(max(1.0, low / max(width, height)), high / max(width, height))
    return round(width * scale), round(height * scale)


def _scores(line: dict) -> str:
    return ", ".join(f"{s} {_number(line[s])}" for s in PER_IMAGE_SCORES if line.get(s) is not None)


def _side(name: str, line: dict, folder: Path, page: Path) -> str:
    src = quote(os.path.relpath(folder / line.get("path", ""), page.parent).replace(os.sep, "/"))
    width, height = _shown_size(line)
    return (f"<div class='side'><b>{name}</b><a href='{_text(src)}'><img class='{name.lower()}' src='{_text(src)}' "
            f"width='{width}' height='{height}' loading='lazy' alt='{name}'></a><small>{_scores(line)}</small></div>")


def _differences(pair: ImagePair) -> str:
    found = [(s, pair.difference(s)) for s in PER_IMAGE_SCORES if pair.difference(s) is not None]
    return "B - A: " + ", ".join(f"{s} {d:+.4g}" for s, d in found) if found else ""


def votes_table(counts: Counts | None, questions: tuple[str, ...]) -> str:
    """Per question, how many raters preferred A, B or neither on this pair."""
    if not questions:
        return ""
    if not counts:
        return "<p class='votes'><small>no votes on this pair</small></p>"
    head = "<tr><th>raters</th>" + "".join(f"<th>{c}</th>" for c in CHOICES) + "</tr>"
    rows = "".join(f"<tr data-question='{_text(q)}'><td>{_text(q)}</td>"
                   + "".join(f"<td data-choice='{c}'>{_text(counts[q][c])}</td>" for c in CHOICES) + "</tr>"
                   for q in questions if q in counts)
    return f"<table class='votes'>{head}{rows}</table>"


def pair_figure(pair: ImagePair, page: Path, votes: Counts | None, questions: tuple[str, ...]) -> str:
    a = pair.a
    where = f"prompt {a['prompt_index']}, image {a['image_index']}, seed {a['seed']}" + \
        (f", {a['category']}" if a.get("category") else "")
    return (f"<figure class='pair' data-prompt-index='{_text(a['prompt_index'])}' "
            f"data-image-index='{_text(a['image_index'])}' data-seed='{_text(a['seed'])}'><div class='sides'>"
            f"{_side('A', a, pair.folder_a, page)}"
            f"{_side('B', pair.b, pair.folder_b, page)}</div><figcaption><p class='prompt'>{_text(a['prompt'])}</p>"
            f"<small>{_text(where)}<br>{_differences(pair)}</small>{votes_table(votes, questions)}</figcaption></figure>")


def pairs_part(pairs: list[ImagePair], page: Path, votes: dict | None, questions: tuple[str, ...],
               max_pairs: int) -> str:
    """The first ``max_pairs`` image pairs: with a study, those raters voted on first; then in ``pair_order``
    (``votes`` None: no study given)."""
    pairs = pair_order(pairs)
    voted = 0
    if votes:
        pairs = sorted(pairs, key=lambda p: p.key not in votes)  # stable: each part keeps pair_order
        voted = sum(p.key in votes for p in pairs)
    shown = f"{max_pairs} of {len(pairs)} pairs" if len(pairs) > max_pairs else f"{len(pairs)} pairs"
    unrated = "" if votes is None or votes else \
        "<p><small>The studies hold no votes on these checkpoints at this guidance scale.</small></p>"
    rated = f"The {voted} pairs raters voted on first; then: " if voted else ""
    figures = "".join(pair_figure(p, page, (votes or {}).get(p.key), questions if votes else ())
                      for p in pairs[:max_pairs])
    return (f"<h3>A and B, same prompt and seed ({shown})</h3><p class='order'>{_text(rated + order_sentence(pairs))}"
            f"</p>{unrated}<div class='pairs'>{figures}</div>")


def section_heading(result: dict) -> str:
    """A section's opening tag, heading, what was scored (weights, sampler, steps, guidance) and what the interval
    and p were computed on."""
    guidance = _number(result["guidance"], "g")
    sampler = f", {result['sampler_a']}" if result.get("sampler_a") else ""
    return (f"<section class='guidance' data-guidance='{guidance}'><h2>Guidance {guidance}{_text(sampler)}</h2>"
            f"<p class='scored'>Scored: {_text(scored_text(result))}.</p>"
            f"<p><small>{_text(result['n_images'])} images of {_text(result['n_prompts'])} prompts, "
            f"{_text(replicates_text(result))}; the interval and p-value resample prompts.</small></p>")


def section(out: Path, page: Path, result: dict, rows: tuple[dict, dict], studies: list[StudyVotes],
            max_pairs: int) -> str:
    """One guidance scale (and sampler): the verdict per family, the raters' preference, the verdict table, then
    the image pairs with their votes."""
    questions = tuple(dict.fromkeys(q for s in studies for q in s.questions))
    votes = pair_votes(studies, *rows) if studies else None
    return (f"{section_heading(result)}{raters_part(raters_preference(studies, *rows))}{verdict_table(result)}"
            f"{pairs_part(image_pairs(out, *rows), page, votes, questions, max_pairs)}</section>")


def _header(a: dict, b: dict, studies: list[StudyVotes]) -> str:
    """Who A and B are: label, checkpoint file name and hash (no folder: the app serves this page to other
    machines), and the studies by folder name."""
    who = "".join(f"<li><b>{side}</b> = {_text(r['model'])} <small>({_text(Path(str(r['checkpoint'])).name)}, hash "
                  f"{_text(r.get('checkpoint_hash') or 'none')})</small></li>" for side, r in (("A", a), ("B", b)))
    raters = (f"<p>Raters' votes (study folder {_text(', '.join(s.folder.name for s in studies))}): per pair and "
              f"question, how many raters preferred A, B or neither (main pairs only; repeated showings, gold checks "
              f"and raters the study's report excluded are left out).</p>") if studies else ""
    return (f"<h1>{_text(a['model'])} vs {_text(b['model'])}</h1><ul>{who}</ul>"
            f"<p>Differences are B - A. A row is green where B is better after Holm's adjustment within its family "
            f"of metrics, red where A is; its p column is that adjusted p, the next its metric's own.</p>{raters}")


def write_compare_page(out: str | Path, a: str, b: str, results: list[dict], studies: list[StudyVotes] = (),
                       max_pairs: int | None = None) -> Path:
    """``OUT/compare/<A>-vs-<B>.html`` for the comparisons ``compare_store(out, a, b)`` returned, with at most
    ``max_pairs`` (default ``MAX_PAIRS``) image pairs per guidance scale."""
    out, max_pairs = Path(out), max_pairs or MAX_PAIRS
    rows = ResultsStore(out).rows()
    found_a, found_b = rows_of(rows, a), rows_of(rows, b)
    sections = [(found_a[r["guidance"], r["sampler_a"]], found_b[r["guidance"], r["sampler_b"]]) for r in results]
    check_studies(list(studies), sections)
    page = comparison_page(out, results[0]["a"], results[0]["b"])
    page.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(section(out, page, r, rs, list(studies), max_pairs) for r, rs in zip(results, sections))
    title = f"{results[0]['a']} vs {results[0]['b']}"
    return write_text_whole(page, f"<!doctype html><html><head><meta charset='utf-8'><title>{_text(title)}</title>"
                                  f"<style>{STYLE}</style></head><body>{_header(*sections[0], list(studies))}{body}"
                                  f"</body></html>\n")
