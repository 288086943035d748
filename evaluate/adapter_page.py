"""``OUT/adapter-report.html``: the adapter report's grid, one row per adapter file and one column per strength
(the base first), each cell the entry's first held-out and first neutral image beside its figures (B - A with the
95% interval and the verdict after Holm's adjustment, ``verdict.interval_shown`` and ``verdict.verdict_shown``),
and the recommendation above it. Images are linked by their paths inside OUT; every text is escaped."""
from __future__ import annotations

import html
from pathlib import Path

from models.common import write_text_whole

PAGE_FILE = "adapter-report.html"
FIRST = "images/00000-000.png"  # the first prompt's first image (evaluate/samples.py's names)


def _text(value) -> str:
    return html.escape(str(value), quote=True)


def _image(folder: str, title: str) -> str:
    src = _text(f"{folder}/{FIRST}")
    return f"<img src='{src}' alt='{_text(title)}' title='{_text(title)}' width='128'>"


def _figures(result: dict) -> str:
    from .verdict import interval_shown, verdict_shown

    rows = "".join(f"<tr class='better-{_text(m['better_holm'] or 'none')}'><td>{_text(m['name'])}</td>"
                   f"<td>{_text(interval_shown(m))}</td><td>{_text(verdict_shown(m))}</td></tr>"
                   for m in result["metrics"])
    return f"<table class='figures'>{rows}</table>"


def _cell(result: dict) -> str:
    return (f"<td data-entry='{_text(result['entry'])}'>{_image(result['samples'], 'held-out')}"
            f"{_image(result['neutral_samples'], 'neutral')}{_figures(result)}</td>")


def adapter_page(report: dict) -> str:
    """The page's HTML."""
    strengths = sorted({r["strength"] for r in report["entries"]})
    files = list(dict.fromkeys(r["file"] for r in report["entries"]))
    by = {(r["file"], r["strength"]): r for r in report["entries"]}
    base = f"<td>{_image(report['base_samples'], 'base, held-out')}</td>"
    head = "".join(f"<th>strength {s:g}</th>" for s in strengths)
    rows = "".join(f"<tr><th>{_text(Path(f).name)}</th>{base}"
                   + "".join(_cell(by[(f, s)]) if (f, s) in by else "<td></td>" for s in strengths) + "</tr>"
                   for f in files)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>adapter report</title><style>"
            "td{vertical-align:top} .better-B{color:#060} .better-A{color:#a00} table.figures{font-size:small}"
            "</style></head><body>"
            f"<h1>Adapters on {_text(report['base'])}</h1>"
            f"<p class='recommendation'>{_text(report['recommendation']['sentence'])}</p>"
            f"<p>B - A: the adapted entry minus the base on the same prompts and seeds ({report['n_prompts']['held-out']}"
            f" held-out, {report['n_prompts']['neutral']} neutral prompts); 95% intervals, verdicts after Holm's "
            f"adjustment within each family.</p>"
            f"<table><tr><th>adapter</th><th>base</th>{head}</tr>{rows}</table></body></html>\n")


def write_adapter_page(out: str | Path, report: dict) -> Path:
    return write_text_whole(Path(out) / PAGE_FILE, adapter_page(report))
