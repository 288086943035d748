"""The Scores tab's screenshots in docs/app.md (docs/images/scores-tab.png, scores-tab-cost.png), taken on
`dwb demo`'s results.

    dwb demo --quick --out /tmp/demo
    python scripts/screenshot_scores_tab.py /tmp/demo            # writes docs/images/scores-tab.png
    python scripts/screenshot_scores_tab.py /tmp/demo --x-axis GPU-hours   # docs/images/scores-tab-cost.png

Compares the demo's last two checkpoints (`dwb evaluate compare`, so that the tab links a compare page; the
first phase's are at another size, which compare refuses),
starts `dwb app --checkpoints DEMO/runs --results DEMO/eval` on a free port, opens the Scores tab in headless
Chromium (Debian's /usr/bin/chromium, as the browser tests use), picks the x axis, selects the last row of the
table (its step cell) and saves the tab.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DWB = Path(sys.executable).parent / "dwb"
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compare_last_two(eval_folder: Path) -> None:
    """`dwb evaluate compare` of the store's last two models, unless a compare page is there already."""
    if list((eval_folder / "compare").glob("*-vs-*.html")):
        return
    rows = [json.loads(line) for line in (eval_folder / "results.jsonl").read_text().splitlines() if line.strip()]
    models = list(dict.fromkeys(r["model"] for r in rows if r.get("status", "ok") == "ok"))
    subprocess.run([DWB, "evaluate", "compare", models[-2], models[-1], "--out", eval_folder], check=True)


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if process.poll() is not None:
            raise SystemExit(f"dwb app ended with {process.returncode}")
        try:
            urllib.request.urlopen(f"{url}/gradio_api/info", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("dwb app did not answer in time")


def screenshot(url: str, out: Path, x_axis: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 900})
        page.goto(url)
        page.get_by_role("tab", name="Scores").click()
        page.locator("#scores-plot circle.point").first.wait_for()
        if x_axis != "training step":
            page.locator("#scores-x label", has_text=x_axis).click()
            page.locator("#scores-plot .x-title", has_text=f"{x_axis} to reach the checkpoint").wait_for()
        cells = page.locator("#scores-table [data-editable]")  # row by row: the last row's step, its second cell
        columns = page.locator("#scores-table thead th").count()
        cells.nth(cells.count() - columns + 1).click()
        page.locator("#scores-open:not([disabled])").wait_for()
        page.locator("#scores-compare-pages a").first.wait_for()
        page.locator(".tabitem:visible").first.screenshot(path=str(out))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("demo", type=Path, help="the folder `dwb demo --out` wrote")
    parser.add_argument("out", type=Path, nargs="?", help="default: docs/images/scores-tab.png, or scores-tab-cost.png "
                        "against GPU-hours or dollars")
    parser.add_argument("--x-axis", default="training step", choices=["training step", "GPU-hours", "dollars"])
    args = parser.parse_args()
    name = "scores-tab.png" if args.x_axis == "training step" else "scores-tab-cost.png"
    args.out = args.out or REPO / "docs" / "images" / name
    compare_last_two(args.demo / "eval")
    port = free_port()
    app = subprocess.Popen([DWB, "app", "--checkpoints", args.demo / "runs", "--results", args.demo / "eval",
                            "--port", str(port)], env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"},
                           stdout=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", app)
        screenshot(f"http://127.0.0.1:{port}", args.out, args.x_axis)
    finally:
        app.terminate()
        app.wait(30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
