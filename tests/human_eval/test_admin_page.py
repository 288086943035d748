"""The admin dashboard as its reader meets it: the study named by its folder, a page that fits a laptop screen,
and a chart whose titles are whole."""
from pathlib import Path

import httpx
import pytest

from human_eval.samples import read_manifest
from human_eval.study import build_study, load_study

from .conftest import Server, drawbench, start_rater, write_samples
from ..conftest import CHROMIUM, CHROMIUM_ARGS, needs_chromium

# checkpoint names as people give them; long enough that "a vs b" outgrew its panel of the chart
MODELS = ("sd2-base-512px-ema-lion-warmup", "sd2-base-512px-ema-adamw-cosine", "sd2-base-768px-v-prediction-ft")


@pytest.fixture(scope="module")
def voted_study(tmp_path_factory) -> Path:
    """Three models on 6 prompts, every main pair voted on by two raters: a dashboard with every table and panel."""
    root = tmp_path_factory.mktemp("admin")
    samples = []
    for seed, name in enumerate(MODELS):
        samples += read_manifest(write_samples(root / name, name, drawbench(6), 1, seed=seed))
    build_study(samples, root / "spring-ablation", seed=0, progress=False)
    return root / "spring-ablation"


@pytest.fixture(scope="module")
def server(voted_study):
    with Server(voted_study) as s:
        with httpx.Client(base_url=s.url, timeout=10) as c:
            for _ in range(2):
                c.headers.pop("X-Rater-Key", None)
                rater = start_rater(c)
                while (p := c.get("/api/next", params={"rater": rater}).json()).get("pair"):
                    for q, answer in (("quality", "A"), ("alignment", "B")):
                        c.post("/api/vote", json={"rater": rater, "pair": p["pair"], "question": q, "answer": answer})
        yield s


def admin_page(server) -> str:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        return c.get("/admin", headers={"Authorization": f"Bearer {server.token}"}).text


def test_dashboard_names_the_study_by_its_folder_not_its_random_id(server, voted_study):
    html = admin_page(server)
    study = load_study(voted_study)
    assert "<h1>Human evaluation: spring-ablation</h1>" in html
    assert "<title>spring-ablation: human-eval admin</title>" in html
    assert study.id not in html  # the random id names nothing a person chose
    assert str(voted_study.parent) not in html  # the folder's own name, never where it lies on the server


def test_report_and_joined_page_name_the_study_by_its_folder(voted_study):
    from human_eval.analysis import analyze
    from human_eval.joined import humans_beside_metrics
    from human_eval.joined_page import page
    from human_eval.report import summary
    from human_eval.scores import ScoreRows

    study = load_study(voted_study)
    results = analyze(study, [], n_boot=50)
    assert results["study"] == study.id and results["study_name"] == "spring-ablation"  # the id still identifies
    assert summary(results).startswith("study spring-ablation: ")
    joined = humans_beside_metrics(study, [], ScoreRows(), n_boot=50)
    html = page(joined)
    assert "study spring-ablation</h1>" in html and study.id not in html


@needs_chromium
def test_dashboard_fits_a_laptop_screen(server):
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{server.url}/admin?token={server.token}")
        page.wait_for_selector("img.chart")
        page.wait_for_function("document.querySelector('img.chart').complete")
        width, viewport = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
        boxes = page.evaluate("[...document.querySelectorAll('table, pre, img')].map("
                              "e => [e.tagName, e.getBoundingClientRect().right, e.parentElement.scrollWidth,"
                              " e.parentElement.clientWidth])")
        browser.close()
    assert width <= viewport == 1280
    for tag, right, scroll, client in boxes:  # each table whole in view, none scrolled inside a box of its own
        assert right <= viewport and scroll <= client, tag


def test_chart_titles_lie_inside_the_figure(server):
    """Every title (the figure's and each panel's) is drawn whole inside the figure and clear of the others."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from human_eval import chart

    with httpx.Client(base_url=server.url, timeout=30) as c:
        results = c.get("/admin/results.json", headers={"Authorization": f"Bearer {server.token}"}).json()
    figures = []
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        real_savefig(fig, *args, **kwargs)
        figures.append(fig)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", keep)
        mp.setattr(plt, "close", lambda fig=None: None)
        chart.plot_preferences(results, Path("/dev/null"))
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    titles = [fig._suptitle] + [ax.title for ax in fig.axes if ax.title.get_text()]
    assert len(titles) == 1 + 3 + 1  # three model pairs and Bradley-Terry
    extents = [t.get_window_extent(renderer) for t in titles]
    for title, e in zip(titles, extents):
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, title.get_text()
    for i, e in enumerate(extents):
        for f in extents[i + 1:]:
            assert not e.overlaps(f), "two titles drawn over each other"
    plt.close(fig)
