"""`dwb human-eval report --results`: each human-preference score's agreement with the study's raters, per model
pair and per image pair, with intervals, from the per-image scores evaluate's manifests carry."""
import json

import numpy as np

from human_eval.samples import read_manifest
from human_eval.store import Store, database_url
from human_eval.study import build_study, load_study

from ..conftest import run_dwb
from .conftest import drawbench, write_samples
from .test_joined import QUESTIONS, evaluate_row, votes_by

NAMES = ("m0", "m1", "m2")


def test_each_preference_score_agrees_with_raters_as_measured(tmp_path):
    """Votes follow PickScore; HPSv2.1 runs against the models' order and within each pair's images; ImageReward is
    noise. The table says so for each, with intervals; the joined page names them."""
    rng = np.random.default_rng(5)
    prompts = drawbench()[:12]
    samples, rows = [], []
    for step, name in enumerate(NAMES):
        manifest = write_samples(tmp_path / name, name, prompts, 1, size=8, seed=step)
        lines = [json.loads(x) for x in manifest.read_text().splitlines()]
        for line in lines:
            line["pickscore"] = round(20 + step + float(rng.normal(0, 0.3)), 4)
            line["hps"] = round(0.3 - line["pickscore"] / 100, 6)  # ordered against PickScore, image by image
            line["imagereward"] = round(float(rng.normal(0, 1)), 4)
        manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
        samples += read_manifest(manifest)
        means = {k: float(np.mean([x[k] for x in lines])) for k in ("pickscore", "hps", "imagereward")}
        rows.append(evaluate_row(name, step, 0.3, **{k: v for k, v in means.items()},
                                 **{f"{k}_lo": v - 0.1 for k, v in means.items()},
                                 **{f"{k}_hi": v + 0.1 for k, v in means.items()}))
    build_study(samples, tmp_path / "study", gold=2, seed=0, progress=False)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    from human_eval.joined import humans_beside_metrics
    from human_eval.scores import read_scores

    study = load_study(tmp_path / "study")
    pick = {t: image.metrics.get("pickscore") for t, image in study.images.items()}  # gold decoys have none
    votes = votes_by(study, lambda p: "a" if pick[p.a] > pick[p.b] else "b")
    joined = humans_beside_metrics(study, votes, read_scores([tmp_path / "eval"]), n_boot=300)
    for q in QUESTIONS:
        image = {x["metric"]: x for x in joined["agreement"][q]["image_pairs"]}
        pairs = {x["metric"]: x for x in joined["agreement"][q]["model_pairs"]}
        assert image["pickscore"]["agreement"] == 1.0 and image["pickscore"]["interval"] == [1.0, 1.0]
        assert image["hps"]["agreement"] == 0.0 and image["hps"]["label"] == "HPSv2.1"
        lo, hi = image["imagereward"]["interval"]
        assert lo < image["imagereward"]["agreement"] < hi and lo < 0.5 < hi  # noise: cannot tell from a coin
        assert pairs["pickscore"]["source"] == "study images" and pairs["pickscore"]["agreement"] == 1.0
        assert pairs["hps"]["agreement"] == 0.0 and pairs["hps"]["model_pairs"] == 3

    store = Store(database_url(tmp_path / "study" / "votes.sqlite"), study.id)
    coin = np.random.default_rng(9)
    for rater in ("r0", "r1"):  # r0 follows PickScore, r1 tosses a coin: the models stay apart, not unanimously
        store.add_rater(rater)
        for p in study.pairs:
            store.show(rater, p.id, False)
            for q in QUESTIONS:
                if p.kind != "main":
                    choice = p.gold
                else:
                    choice = ("a" if pick[p.a] > pick[p.b] else "b") if rater == "r0" else "ab"[int(coin.integers(2))]
                store.vote(rater, p.id, q, {"a": "A", "b": "B"}[choice], 900)
    store.close()
    r = run_dwb("human-eval", "report", str(tmp_path / "study"), "--results", str(tmp_path / "eval"),
                "--out", str(tmp_path / "out"), "--bootstrap", "100")
    assert r.returncode == 0, r.stderr
    assert "PickScore orders 100.0%" in r.stdout and "HPSv2.1 orders 0.0%" in r.stdout
    html = (tmp_path / "out" / "joined.html").read_text()
    assert all(f"<th>{label} [95%]</th>" in html for label in ("PickScore", "HPSv2.1", "ImageReward"))
