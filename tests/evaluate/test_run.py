"""`dwb evaluate run` end to end on tiny checkpoints, reference sets, and the checkpoint watcher."""
import csv
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from evaluate.scorers.features import InceptionExtractor
from evaluate.prompts import shapes_prompts
from evaluate.reference import reference_stats
from evaluate.run import EvalConfig, evaluate_checkpoints
from evaluate.store import ResultsStore, checkpoint_identity
from evaluate.watch import Watcher
from models.checkpoints import find_checkpoint, read_checkpoint
from models.errors import WorkbenchError


def _cfg(tmp_path, shapes_data, inception_weights, **kw) -> EvalConfig:
    base = dict(out=str(tmp_path / "results"), reference=str(shapes_data / "eval/32"),
                inception_weights=str(inception_weights), prompts="shapes", n_prompts=4, n_per_prompt=1,
                n_reference=16, guidance=(1.5, 5.0), steps=2, size=16, batch_size=4, kid_subsets=3,
                kid_subset_size=4, inception_features=64, device="cpu", progress=False)
    base.update(kw)
    return EvalConfig(**base)


def test_run_scores_checkpoints_and_writes_store_csv_plots_and_samples(tiny_run, shapes_data, inception_weights,
                                                                       tiny_clip, tmp_path):
    from models.checkpoints import checkpoint_cost

    cfg = _cfg(tmp_path, shapes_data, inception_weights, clip=str(tiny_clip))
    ckpts = [tiny_run / "ep0-ba2-rank0.pt", tiny_run / "ep0-ba4-rank0.pt"]
    rows = evaluate_checkpoints(cfg, ckpts)
    assert [(r["step"], r["guidance"]) for r in rows] == [(2, 1.5), (2, 5.0), (4, 1.5), (4, 5.0)]
    for r in rows:
        assert np.isfinite(r["fid"]) and r["fid"] > 0 and np.isfinite(r["kid_mean"])
        assert -100 <= r["clip_score"] <= 100 and r["n_images"] == 4 and r["n_reference"] == 16
        assert r["seconds_total"] > 0 and r["seconds_checkpoint"] >= r["seconds_total"]
    assert rows[0]["fid"] != rows[1]["fid"]  # guidance changes the images
    for r in rows:  # a 95% interval on every metric (200 bootstrap replicates by default)
        for key in ("fid", "kid_mean", "clip_score"):
            assert r[f"{key}_lo"] <= r[key] <= r[f"{key}_hi"] and r[f"{key}_lo"] < r[f"{key}_hi"], (key, r)
        assert r["bootstrap"] == 200 and r["fid_infinity"] is None  # 4 images: too few for FD-infinity's fit
        assert [c["category"] for c in r["categories"]] == sorted({p.category for p in shapes_prompts(4)})
        assert sum(c["n_images"] for c in r["categories"]) == 4

    out = tmp_path / "results"
    assert len(ResultsStore(out).rows()) == 4
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and float(table[0]["fid"]) == pytest.approx(rows[0]["fid"])
    assert float(table[0]["fid_hi"]) == pytest.approx(rows[0]["fid_hi"])
    with open(out / "categories.csv") as f:
        assert {(c["model"], c["category"]) for c in csv.DictReader(f)} == {
            (r["model"], c["category"]) for r in rows for c in r["categories"]}
    for name in ("metrics_vs_step.png", "tradeoff.png", "index.html"):
        assert (out / "report" / name).stat().st_size > 0
    assert not (out / "report" / "attributes_vs_step.png").exists()  # no scorer, no attribute plot
    samples = out / rows[3]["samples"]
    manifest = [json.loads(line) for line in (samples / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 4 and manifest[0]["guidance"] == 5.0 and (samples / manifest[0]["path"]).is_file()
    assert np.mean([m["clip_score"] for m in manifest]) == pytest.approx(rows[3]["clip_score"], abs=1e-3)  # per image
    assert list((samples / "grids").glob("*.png"))
    assert "grids/" in (out / "report" / "index.html").read_text()
    assert list((out / "cache").glob("ref-*.pt"))  # reference statistics cached

    # what reaching each checkpoint cost (resumes and earlier phases included); the suite's run sets no price
    recorded = [checkpoint_cost(c) for c in ckpts]
    assert [r["gpu_hours"] for r in rows] == [c["gpu_hours_total"] for c in recorded for _ in (1.5, 5.0)]
    assert recorded[0]["gpu_hours_total"] < recorded[1]["gpu_hours_total"] and not any("usd" in r for r in rows)
    assert [float(r["gpu_hours"]) for r in table] == [r["gpu_hours"] for r in rows]


def _image_folder(tmp_path, n_good: int, n_bad: int):
    folder = tmp_path / "ref"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n_good):
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    for i in range(n_bad):
        (folder / f"{i:03d}b.png").write_bytes(b"not a png")  # sorted between the good ones
    return folder


def test_reference_stats_skip_unreadable_images_and_cache(inception_weights, tmp_path):
    folder = _image_folder(tmp_path, 5, 2)
    ex = InceptionExtractor(inception_weights, dim=64)
    first = reference_stats(folder, ex, 16, 5, tmp_path / "cache", batch_size=2, progress=False)
    assert (first.stats.n, first.skipped, first.cached) == (5, 2, False)
    again = reference_stats(folder, ex, 16, 5, tmp_path / "cache", progress=False)
    assert again.cached and again.key == first.key
    assert torch_equal(again.stats.outer, first.stats.outer)
    other = reference_stats(folder, ex, 24, 5, tmp_path / "cache", progress=False)  # another resize policy
    assert not other.cached and other.key != first.key
    with pytest.raises(WorkbenchError, match="5 readable images, fewer than the 8 requested"):
        reference_stats(folder, ex, 16, 8, tmp_path / "cache", progress=False)
    assert reference_stats(folder, ex, 16, 8, tmp_path / "cache", allow_fewer=True, progress=False).stats.n == 5


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_cmmd_on_clip_image_embeddings(tiny_run, shapes_data, inception_weights, tiny_clip, tmp_path):
    from itertools import islice

    from evaluate.scorers.clip import ClipScorer
    from evaluate.statistics.metrics import cmmd
    from evaluate.reference import iter_images

    cfg = _cfg(tmp_path, shapes_data, inception_weights, clip=str(tiny_clip), cmmd=True, guidance=(1.5, 8.0))
    rows = evaluate_checkpoints(cfg, [tiny_run / "ep0-ba4-rank0.pt"])
    assert all(np.isfinite(r["cmmd"]) and r["cmmd"] > 0 for r in rows)
    assert rows[0]["cmmd"] != rows[1]["cmmd"]  # guidance changes the images, so their embeddings
    assert "cmmd" in (tmp_path / "results/results.csv").read_text().splitlines()[0].split(",")
    # the row's value is CMMD between the reference's and the saved samples' embeddings, recomputed here
    extractor = ClipScorer(tiny_clip).image_extractor()
    ref = extractor(torch.from_numpy(np.stack(list(islice(iter_images(shapes_data / "eval/32", 16), 16)))).permute(0, 3, 1, 2))
    samples = sorted((tmp_path / "results" / rows[1]["samples"] / "images").glob("*.png"))
    fake = extractor(torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in samples])).permute(0, 3, 1, 2))
    assert rows[1]["cmmd"] == pytest.approx(cmmd(ref, fake), rel=1e-6)
    with pytest.raises(WorkbenchError, match="--cmmd needs a CLIP model"):
        evaluate_checkpoints(_cfg(tmp_path / "no-clip", shapes_data, inception_weights, cmmd=True),
                             [tiny_run / "ep0-ba4-rank0.pt"])


def test_generation_precision_is_chosen_and_recorded(tiny_run, shapes_data, inception_weights, tmp_path):
    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    rows = {}
    for dtype, bootstrap in (("auto", 200), ("bf16", 0)):  # auto is float32 on a CPU
        cfg = _cfg(tmp_path / dtype, shapes_data, inception_weights, guidance=(5.0,), dtype=dtype, bootstrap=bootstrap)
        rows[dtype] = evaluate_checkpoints(cfg, [ckpt])[0]
    assert rows["auto"]["dtype"] == "float32" and rows["bf16"]["dtype"] == "bfloat16"
    assert rows["bf16"]["bootstrap"] == 0 and not [k for k in rows["bf16"] if k.endswith(("_lo", "_hi"))]  # off
    assert not [k for c in rows["bf16"]["categories"] for k in c if k.endswith(("_lo", "_hi"))]
    assert np.isfinite(rows["bf16"]["fid"]) and rows["bf16"]["fid"] != rows["auto"]["fid"]
    with pytest.raises(WorkbenchError, match="unknown dtype 'int8'"):
        evaluate_checkpoints(_cfg(tmp_path / "bad", shapes_data, inception_weights, dtype="int8"), [ckpt])


def test_sampler_is_chosen_recorded_and_kept_apart(tiny_run, shapes_data, inception_weights, tmp_path):
    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    out = tmp_path / "results"
    own = evaluate_checkpoints(_cfg(tmp_path, shapes_data, inception_weights, guidance=(5.0,)), [ckpt])[0]
    ddim = evaluate_checkpoints(_cfg(tmp_path, shapes_data, inception_weights, guidance=(5.0,), sampler="DDIM"),
                                [ckpt])[0]
    assert own["sampler"] == "DPM++ 2M" and ddim["sampler"] == "DDIM"  # the pipeline's own, then the asked one
    assert own["samples"] != ddim["samples"] and own["fid"] != ddim["fid"]  # both sample sets kept, different images
    for row in (own, ddim):
        manifest = [json.loads(line) for line in (out / row["samples"] / "manifest.jsonl").read_text().splitlines()]
        assert {m["sampler"] for m in manifest} == {row["sampler"]}
        with Image.open(out / row["samples"] / manifest[0]["path"]) as im:
            assert f"Sampler: {row['sampler']}," in im.text["parameters"]
    with open(out / "results.csv") as f:
        assert [r["sampler"] for r in csv.DictReader(f)] == ["DPM++ 2M", "DDIM"]
    assert "<th>sampler</th>" in (out / "report" / "index.html").read_text()  # a sweep's rows told apart
    with pytest.raises(WorkbenchError, match="unknown sampler 'Karras 9000'; choose one of: DDIM, Euler"):
        evaluate_checkpoints(_cfg(tmp_path / "bad", shapes_data, inception_weights, sampler="Karras 9000"), [ckpt])


def test_corrupt_checkpoint_and_missing_weights_are_one_line_errors(shapes_data, inception_weights, tmp_path, capsys):
    from dwb import main

    bad = tmp_path / "ep0-ba2-rank0.pt"
    bad.write_bytes(b"\0" * 100)
    cfg = _cfg(tmp_path, shapes_data, inception_weights)
    with pytest.raises(WorkbenchError, match="cannot read checkpoint"):
        evaluate_checkpoints(cfg, [bad])
    code = main(["evaluate", "run", str(bad), "--out", str(tmp_path / "o"), "--reference", str(shapes_data / "eval/32"),
                 "--inception-weights", str(tmp_path / "missing")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.startswith("error:") and "weights-inception-2015-12-05-6726825d.pth" in err
    assert len(err.splitlines()) == 1


def test_watcher_scores_each_checkpoint_once_across_restarts(tiny_run, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(tiny_run / "ep0-ba2-rank0.pt", run / "checkpoints")
    full = (tiny_run / "ep0-ba4-rank0.pt").read_bytes()
    partial = run / "checkpoints" / "ep0-ba4-rank0.pt"
    partial.write_bytes(full[: len(full) // 2])  # still being written
    store = ResultsStore(tmp_path / "results")
    scored = []

    def score(ckpt):
        read_checkpoint(ckpt.path)  # raises CheckpointError for a whole zip that is no workbench checkpoint
        scored.append(ckpt.path.name)
        store.append({"checkpoint": ckpt.ref, "status": "ok", **checkpoint_identity(ckpt)})

    def record(ckpt, error):
        store.append({"checkpoint": ckpt.ref, "status": "unreadable", "error": str(error), **checkpoint_identity(ckpt)})

    now = [0.0]
    watcher = Watcher(run, store, score, record, settle=5, clock=lambda: now[0])
    partial_since = now[0]
    assert watcher.poll_once() == []  # first sight: not yet known to be stable
    now[0] += 1
    partial.write_bytes(full[: len(full) * 3 // 4])  # the writer goes on
    now[0] += 5
    assert [c.path.name for c in watcher.poll_once()] == ["ep0-ba2-rank0.pt"]  # ba4 changed 5 s ago: not settled
    partial.write_bytes(full)  # the writer finishes
    now[0] += 6
    assert watcher.poll_once() == []  # changed since the last look: wait
    now[0] += 6
    assert [c.path.name for c in watcher.poll_once()] == ["ep0-ba4-rank0.pt"]
    assert now[0] - partial_since > 5  # the file was seen torn for longer than `settle`, but never settled torn

    torch.save({"not": "a checkpoint"}, run / "checkpoints" / "ep0-ba6-rank0.pt")  # whole, but unloadable
    restarted = Watcher(run, store, score, record, settle=0)
    assert restarted.poll_once() == [] and restarted.poll_once() == []
    assert scored == ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"]
    assert [r["status"] for r in store.rows()] == ["ok", "ok", "unreadable"]  # recorded once, not retried
    assert "not a Composer checkpoint" in store.rows()[-1]["error"]


def test_cli_watch_scores_a_run_once(tiny_run, shapes_data, inception_weights, tmp_path, capsys):
    from dwb import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run / "checkpoints")
    args = ["evaluate", "watch", str(run), "--out", str(tmp_path / "res"), "--reference", str(shapes_data / "eval/32"),
            "--inception-weights", str(inception_weights), "--inception-features", "64", "--prompts", "shapes",
            "--n-prompts", "3", "--n-reference", "16", "--guidance", "4", "--steps", "2", "--size", "16",
            "--kid-subset-size", "3", "--kid-subsets", "2", "--device", "cpu", "--settle", "0", "--max-polls", "1"]
    assert main(args) == 0
    assert main(args) == 0  # a restart finds nothing new
    rows = ResultsStore(tmp_path / "res").rows()
    assert sorted(r["step"] for r in rows) == [2, 4]
    assert capsys.readouterr().out.count("scored ") == 2
    assert (tmp_path / "res" / "report" / "metrics_vs_step.png").is_file()
    assert not (tmp_path / "res" / "report" / "tradeoff.png").exists()  # no CLIP score, no attributes: no trade-off


def _watch_args(run, out, shapes_data, inception_weights, *extra):
    return ["evaluate", "watch", str(run), "--out", str(out), "--reference", str(shapes_data / "eval/32"),
            "--inception-weights", str(inception_weights), "--inception-features", "64", "--prompts", "shapes",
            "--n-prompts", "3", "--n-reference", "16", "--guidance", "4", "--steps", "2", "--size", "16",
            "--kid-subset-size", "3", "--kid-subsets", "2", "--device", "cpu", "--settle", "0", "--max-polls", "1",
            *extra]


SETUP_PROBLEMS = {
    "reference smaller than asked": (["--n-reference", "64"], "has 16 images, fewer than the 64 requested"),
    "reference missing": (["--reference", "{tmp}/nowhere"], "reference set not found"),
    "weights missing": (["--inception-weights", "{tmp}/missing.pth"], "weights-inception-2015-12-05-6726825d.pth"),
    "prompt file missing": (["--prompts", "{tmp}/prompts.csv"], "prompts.csv"),
    "output folder unwritable": (["--out", "{tmp}/a-file/results"], "cannot write to the output folder"),
    "device absent": (["--device", "cuda"], "no CUDA GPU is visible"),
}


@pytest.mark.parametrize("problem", list(SETUP_PROBLEMS))
def test_a_setup_problem_stops_the_watcher_at_start_and_records_nothing(problem, tiny_run, shapes_data,
                                                                        inception_weights, tmp_path, capsys):
    from dwb import main

    run, out = tmp_path / "run", tmp_path / "res"
    shutil.copytree(tiny_run, run / "checkpoints")
    (tmp_path / "a-file").write_text("not a folder")
    extra, message = SETUP_PROBLEMS[problem]
    args = _watch_args(run, out, shapes_data, inception_weights, *(a.format(tmp=tmp_path) for a in extra))
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and message in err, err
    assert not (out / "results.jsonl").exists()  # no checkpoint marked: fixing the setup is all it takes
    if problem == "reference smaller than asked":
        assert main(_watch_args(run, out, shapes_data, inception_weights, "--n-reference", "16")) == 0
        assert sorted(r["step"] for r in ResultsStore(out).rows()) == [2, 4]


def test_watch_marks_a_truncated_checkpoint_scores_the_others_and_retries_on_request(tiny_run, shapes_data,
                                                                                   inception_weights, tmp_path, capsys):
    from dwb import main

    run, out = tmp_path / "run", tmp_path / "res"
    (run / "checkpoints").mkdir(parents=True)
    whole = run / "checkpoints" / "ep0-ba2-rank0.pt"
    shutil.copy(tiny_run / "ep0-ba2-rank0.pt", whole)
    full = (tiny_run / "ep0-ba4-rank0.pt").read_bytes()
    (run / "checkpoints" / "ep0-ba4-rank0.pt").write_bytes(full[: len(full) // 2])  # a run killed mid-write
    # what an earlier watcher wrote against a whole file when its reference set was too small
    ResultsStore(out).append({"checkpoint": str(whole), "status": "unreadable",
                              **checkpoint_identity(find_checkpoint(whole)),
                              "error": "reference set has 32 readable images, fewer than the 64 requested"})
    args = _watch_args(run, out, shapes_data, inception_weights)
    assert main(args) == 0
    assert [(r["status"], r.get("step")) for r in ResultsStore(out).rows()] == [("unreadable", None),
                                                                               ("unreadable", None)]
    assert "cannot read checkpoint" in ResultsStore(out).rows()[-1]["error"]
    assert main(args) == 0 and len(ResultsStore(out).rows()) == 2  # neither is tried again by itself
    assert main([*args, "--retry-unreadable"]) == 0
    rows = ResultsStore(out).rows()[2:]
    assert [(r["status"], r.get("step")) for r in rows] == [("ok", 2), ("unreadable", None)]  # ba4 is still torn
    assert capsys.readouterr().out.count("scored ") == 1


def test_run_records_an_unreadable_checkpoint_scores_the_others_and_says_so(tiny_run, shapes_data,
                                                                          inception_weights, tmp_path):
    torn = tmp_path / "ep0-ba6-rank0.pt"
    full = (tiny_run / "ep0-ba4-rank0.pt").read_bytes()
    torn.write_bytes(full[: len(full) // 2])
    cfg = _cfg(tmp_path, shapes_data, inception_weights, guidance=(4.0,), n_prompts=2)
    with pytest.raises(WorkbenchError, match=r"1 of 2 checkpoints could not be scored .*ep0-ba6-rank0.pt"):
        evaluate_checkpoints(cfg, [torn, tiny_run / "ep0-ba2-rank0.pt"])
    rows = ResultsStore(tmp_path / "results").rows()
    assert [(r["status"], r.get("step")) for r in rows] == [("unreadable", None), ("ok", 2)]


def _args(ckpts, out, shapes_data, inception_weights, *extra) -> list[str]:
    return [*map(str, ckpts), "--out", str(out), "--reference", str(shapes_data / "eval/32"), "--inception-weights",
            str(inception_weights), "--inception-features", "64", "--prompts", "shapes", "--n-prompts", "8",
            "--n-reference", "16", "--guidance", "5", "--steps", "2", "--size", "16",
            "--batch-size", "8", "--kid-subset-size", "8", "--kid-subsets", "2", "--device", "cpu", *extra]


def test_compare_two_checkpoints_with_paired_intervals(tiny_run, shapes_data, inception_weights, tiny_clip,
                                                      tiny_dinov2, tmp_path, capsys):
    """`dwb evaluate run A B`, then `dwb evaluate compare A B` on the store."""
    from dwb import main

    a, b = tiny_run / "ep0-ba2-rank0.pt", tiny_run / "ep0-ba4-rank0.pt"
    out = tmp_path / "res"
    scoring = ["--clip", str(tiny_clip), "--cmmd", "--dinov2", str(tiny_dinov2)]
    assert main(["evaluate", "run", *_args([a, b], out, shapes_data, inception_weights, *scoring)]) == 0
    assert main(["evaluate", "compare", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = ResultsStore(out).rows()
    assert [r["step"] for r in rows] == [2, 4]
    for r in rows:
        assert r["fd_dinov2_lo"] <= r["fd_dinov2"] <= r["fd_dinov2_hi"] and r["cmmd_lo"] <= r["cmmd"] <= r["cmmd_hi"]
        assert 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1 and 0 <= r["coverage"] <= 1 and r["density"] >= 0
        assert r["dinov2"].startswith("dinov2:") and "FD-DINOv2" in printed
    [result] = [json.loads(p.read_text()) for p in (out / "compare").glob("*.json")]
    assert [m["metric"] for m in result["metrics"]] == ["fid", "kid_mean", "clip_score", "cmmd", "fd_dinov2"]
    assert result["n_images"] == 8 and result["n_prompts"] == 8 and result["bootstrap"] == 200
    for m in result["metrics"]:
        assert m["difference"] == pytest.approx(m["b"] - m["a"]) and m["lo"] <= m["difference"] <= m["hi"]
        assert 0 < m["p"] <= 1 and m["sentence"] in printed
        assert m["sentence"].startswith("cannot tell") == (m["better_holm"] is None) == (m["p_holm"] >= 0.05)
    assert "guidance 5, DPM++ 2M, 2 steps, EMA weights" in printed  # what was scored
    assert result["overall"]["heading"] in printed and result["overall"]["n_metrics"] == 5
    assert [f["family"] for f in result["overall"]["families"]] == ["image quality", "text alignment"]
    assert "Comparisons" in (out / "report" / "index.html").read_text()

    from evaluate.compare import compare_store

    [same] = compare_store(out, str(a), str(a), replicates=50)  # a checkpoint against itself: no difference at all
    alike = "B - A = +0 [+0, +0]"
    assert {m["metric"]: m["sentence"].split(": ", 1)[1] for m in same["metrics"]} == {
        **{k: f"{alike} (Holm-adjusted over the 4 image quality metrics: p = 1; its own p = 1)"
           for k in ("fid", "kid_mean", "cmmd", "fd_dinov2")}, "clip_score": f"{alike} (p = 1)"}
    assert same["replicates"] == {"image quality": 400, "text alignment": 50}  # 80 per metric of a family of 4

    assert main(["evaluate", "compare", str(a), str(tiny_run / "ep9-ba9-rank0.pt"), "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()  # not scored, and nothing to score it with
    assert "ep9-ba9-rank0.pt has no scored rows" in err and "give --reference" in err and "\n" not in err

    ResultsStore(out).append({**rows[1], "model": "fewer", "n_images": 4})  # scored on other prompts
    assert main(["evaluate", "compare", str(a), "fewer", "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot compare") and "n_images differs (8 vs 4)" in err and "\n" not in err


@pytest.mark.slow
def test_ema_weights_are_scored_by_default_raw_on_request_and_older_rows_still_compare(
        tiny_run, shapes_data, inception_weights, tmp_path, capsys):
    """A Composer checkpoint holding EMA weights is scored on them unless --weights raw; rows, manifests, PNGs and
    the printed summary say which; a row written before rows named their weights still reads and compares."""
    from dwb import main
    from evaluate.compare import compare_store
    from evaluate.samples import read_manifest

    a, b = tiny_run / "ep0-ba2-rank0.pt", tiny_run / "ep0-ba4-rank0.pt"  # EMA from the first batch
    out = tmp_path / "res"
    assert main(["evaluate", "run", *_args([a, b], out, shapes_data, inception_weights)]) == 0
    ema = ResultsStore(out).rows()
    assert [r["weights"] for r in ema] == ["ema", "ema"] and capsys.readouterr().out.count("(ema weights)") == 2
    assert main(["evaluate", "run", *_args([b], tmp_path / "raw", shapes_data, inception_weights, "--weights", "raw")]) == 0
    [raw] = ResultsStore(tmp_path / "raw").rows()
    assert raw["weights"] == "raw" and "(raw weights)" in capsys.readouterr().out
    assert raw["fid"] != ema[1]["fid"]  # other weights, other images
    manifest = read_manifest(tmp_path / "raw" / raw["samples"] / "manifest.jsonl")
    assert {m["weights"] for m in manifest} == {"raw"}
    with Image.open(tmp_path / "raw" / raw["samples"] / manifest[0]["path"]) as im:
        assert "Weights: raw," in im.text["parameters"]

    from dwb import build_parser
    from evaluate.cli import config_from_args
    from evaluate.config import weights_choice

    older_flag = build_parser().parse_args(["evaluate", "run", str(b), "--out", "o", "--reference", "r", "--ema"])
    assert weights_choice(config_from_args(older_flag)) == "ema"
    assert main(["evaluate", "run", str(b), "--out", "o", "--reference", "r", "--ema", "--weights", "raw"]) == 1
    assert capsys.readouterr().err.strip() == "error: ema: true and weights: raw disagree: give weights alone"

    older = {k: v for k, v in ema[0].items() if k != "weights"}  # as a store written before the field was
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (older, ema[1])))
    assert [r.get("weights") for r in ResultsStore(out).rows()] == [None, "ema"]
    ResultsStore(out).export_csv()
    [result] = compare_store(out, str(a), str(b), replicates=40)
    assert [m["metric"] for m in result["metrics"]][:2] == ["fid", "kid_mean"]


def test_attribute_accuracy_per_image_with_intervals_and_categories(tiny_run, shapes_data, tmp_path):
    """The shapes scorer's verdicts per image in the manifest, intervals on the accuracies, tables per category.
    The scorer is trained for one epoch (its accuracy does not matter here, only how verdicts travel)."""
    from models.shapes.scorer import train_scorer

    scorer = tmp_path / "scorer.pt"
    train_scorer(shapes_data, scorer, epochs=1, batch_size=64, progress=False)
    cfg = EvalConfig(out=str(tmp_path / "res"), reference=str(shapes_data / "eval/32"), scorer=str(scorer),
                     prompts="shapes", n_prompts=8, n_per_prompt=2, n_reference=16, guidance=(5.0,), steps=2, size=16,
                     batch_size=8, kid_subsets=2, kid_subset_size=8, device="cpu", progress=False)
    [row] = evaluate_checkpoints(cfg, [tiny_run / "ep0-ba4-rank0.pt"])
    for key in ("attr_all_all", "attr_single_color", "attr_pair_position", "fid"):
        assert row[f"{key}_lo"] <= row[key] <= row[f"{key}_hi"]
    manifest = [json.loads(line) for line in (tmp_path / "res" / row["samples"] / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 16 and all(isinstance(m["attr_all"], bool) and "clip_score" not in m for m in manifest)
    assert round(np.mean([m["attr_all"] for m in manifest]), 4) == row["attr_all_all"]
    pairs = [m for m in manifest if m["category"] == "two groups"]
    assert pairs and all(isinstance(m["attr_position"], bool) for m in pairs)
    by_category = {c["category"]: c for c in row["categories"]}
    assert set(by_category) == {m["category"] for m in manifest}
    for category, c in by_category.items():
        mine = [m["attr_all"] for m in manifest if m["category"] == category]
        assert c["n_images"] == len(mine) and c["attr_all_all"] == round(float(np.mean(mine)), 4)
        assert c["attr_all_all_lo"] <= c["attr_all_all"] <= c["attr_all_all_hi"]
    report = tmp_path / "res" / "report"
    assert (report / "attributes_vs_step.png").is_file() and (report / "tradeoff.png").is_file()  # accuracy vs FID
    assert "By prompt category" in (report / "index.html").read_text()
