"""Aspect-ratio buckets against square crops, on shapes data where most scenes are wide or tall.

The question: on data whose wide scenes hold two groups side by side (and whose tall ones hold them one above
the other), does a tiny UNet trained with aspect-ratio buckets (``data.aspect_buckets: true``, every batch from
one bucket) draw "A left of B" and "A above B" right more often than the same run on square crops
(``data.aspect_buckets: false``), which cut the sides off a wide scene, and with them part of each group?

One dataset (`dwb data shapes --sizes 32 --wide 0.75`: buckets 40x24, 32x32 and 24x40, converted by `dwb data
convert --aspect-buckets` itself), one set of tiny parts (`dwb prepare`), one shapes scorer trained on that
data's training split; two runs of configs/tiny-bucketed.yaml that differ only in ``data.aspect_buckets`` (same
batches, batch size, seed, parts). Each model draws the held-out prompts as it would be used: the bucketed one
at each prompt's aspect (``OUT/eval/prompts.csv``'s aspect column: its bucket of a 32 px budget), the square one
at 32x32. `dwb evaluate`'s Evaluator scores both (the scorer letterboxes a wide or tall image); evaluate's
``compare_rows`` gives each metric's paired difference, bucketed - square, with its bootstrap interval over
prompts, and the same bootstrap gives position by the prompt's frame.

    .venv/bin/python bench/bucketed_vs_square.py            # about 30 minutes on 2 busy cores
    .venv/bin/python bench/bucketed_vs_square.py --smoke    # end to end in seconds; its figures mean nothing
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import ROOT, RUN, fixtures, parse_args, report

ARMS = {"bucketed": True, "square": False}  # run name -> data.aspect_buckets
GUIDANCE = 3.0  # the demo's, where the tiny model draws best (configs/tiny-phase2.yaml's previews)


def build_data(args) -> tuple[Path, Path, dict]:
    """The wide-heavy dataset, the tiny parts fitted on it and the scorer trained on it (each built once)."""
    from train.shapes import prepare_tiny, write_shapes_dataset
    from models.shapes import train_scorer

    data, scorer = RUN.out / "shapes-wide", RUN.out / "scorer.pt"
    if not (data / "eval" / "prompts.csv").is_file():  # written last
        write_shapes_dataset(data, args.n, args.seed, sizes=(32,), n_eval=args.n_eval, wide=args.wide,
                             workers=1, progress=not RUN.smoke)
    if RUN.smoke:
        parts = fixtures()[1]  # the shared tiny parts: a smoke run's figures mean nothing
    else:
        parts = RUN.out / "components-wide"
        if not (parts / "prepare.json").is_file():
            prepare_tiny(data, parts, vae_steps=args.vae_steps, seed=args.seed, progress=True)
    if not scorer.is_file():
        train_scorer(data, scorer, epochs=args.scorer_epochs, batch_size=args.scorer_batch, lr=6e-3, seed=args.seed,
                     progress=not RUN.smoke)
    return data, parts, scorer


def train_arm(name: str, buckets: bool, data: Path, parts: Path, args) -> tuple[Path, float]:
    """configs/tiny-bucketed.yaml with ``data.aspect_buckets`` set; its last checkpoint and the seconds it took."""
    from train.config import load_config
    from train.trainer import train

    folder = RUN.out / "runs" / name
    done = sorted(folder.glob(f"ep*-ba{args.batches}-rank0.pt"))
    if done:  # trained by an earlier run of this script
        return done[0], float("nan")
    overrides = [f"run_name={name}", f"model.pretrained={parts}", f"data.path={data / '32'}",
                 f"data.aspect_buckets={str(buckets).lower()}", f"save_folder={folder}",
                 f"max_duration={args.batches}ba", f"save_interval={args.batches}ba", f"seed={args.seed + 17}",
                 f"global_train_batch_size={args.batch}", f"device_train_microbatch_size={args.batch}",
                 "progress_bar=false", "loggers=[file]", f"scheduler.t_warmup={max(1, args.batches // 24)}ba"]
    t0 = time.perf_counter()
    train(load_config(ROOT / "configs" / "tiny-bucketed.yaml", overrides))
    return sorted(folder.glob(f"ep*-ba{args.batches}-rank0.pt"))[0], time.perf_counter() - t0


def score_arms(checkpoints: dict[str, Path], data: Path, scorer: Path, args) -> dict[str, dict]:
    """Each arm's row from `dwb evaluate`'s Evaluator: the bucketed model at each prompt's aspect, the square one
    at its square size; same prompts, seeds and scorer."""
    from evaluate.run import EvalConfig, Evaluator

    rows = {}
    for name, ckpt in checkpoints.items():
        cfg = EvalConfig(out=str(RUN.out / "eval"), reference=str(data / "eval" / "32"), scorer=str(scorer),
                         prompts=str(data / "eval" / "prompts.csv"), n_prompts=args.n_prompts,
                         n_per_prompt=args.n_per_prompt, n_reference=min(args.n_eval, 1000), guidance=(GUIDANCE,),
                         steps=args.steps, size=32, aspect_column="aspect" if ARMS[name] else None,
                         batch_size=64, seed=args.seed, kid_subset_size=min(100, args.n_prompts * args.n_per_prompt),
                         bootstrap=args.bootstrap, progress=not RUN.smoke)
        rows[name] = Evaluator(cfg).score(ckpt, model=name)[0]
    return rows


def compare_arms(rows: dict[str, dict], args) -> dict:
    """bucketed - square for every metric, paired over prompts (evaluate's ``compare_rows``). ``compare_rows``
    refuses rows drawn at different aspects, where comparing them would be a mistake; here the difference of
    aspect is the question, so the square row is compared as if drawn at the bucketed one's aspect."""
    from evaluate.compare import compare_rows

    square = {**rows["square"], "aspect": rows["bucketed"]["aspect"]}
    return compare_rows(RUN.out / "eval", square, rows["bucketed"], replicates=args.bootstrap, seed=args.seed)


def position_by_frame(rows: dict[str, dict], data: Path, args) -> dict[str, dict]:
    """Position right (two-group prompts) by the prompt's frame, each arm's and the paired difference with
    evaluate's bootstrap over prompts, as ``compare_rows`` computes it."""
    import numpy as np

    from evaluate.statistics.bootstrap import prompt_weights, weighted_means
    from evaluate.compare import metric_difference
    from evaluate.samples import MANIFEST, read_manifest
    from models.generation import read_prompt_table

    aspects = {p.index: p.aspect for p in read_prompt_table(data / "eval" / "prompts.csv", aspect_column="aspect")}
    frame_of = {(5.0, 3.0): "wide", (3.0, 5.0): "tall", (1.0, 1.0): "square"}
    manifests = {name: read_manifest(RUN.out / "eval" / row["samples"] / MANIFEST) for name, row in rows.items()}
    out = {}
    for frame in ("wide", "tall", "square"):
        keep = [i for i, m in enumerate(manifests["square"])
                if m.get("attr_position") is not None and frame_of[aspects[m["prompt_index"]]] == frame]
        if not keep:
            continue
        prompts = np.array([manifests["square"][i]["prompt_index"] for i in keep])
        weights = prompt_weights(prompts, args.bootstrap, args.seed)
        values = {name: np.array([float(m[i]["attr_position"]) for i in keep]) for name, m in manifests.items()}
        reps = {name: weighted_means(v, weights) for name, v in values.items()}
        diff = metric_difference("attr_pair_position", float(values["square"].mean()), float(values["bucketed"].mean()),
                                 reps["bucketed"] - reps["square"])
        out[frame] = {"images": len(keep), "prompts": int(len(np.unique(prompts))), **diff}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12000, help="training scenes")
    ap.add_argument("--n-eval", type=int, default=1000, help="held-out scenes (reference, scorer check, prompts)")
    ap.add_argument("--wide", type=float, default=0.75, help="share of wide and tall scenes")
    ap.add_argument("--vae-steps", type=int, default=1200)
    ap.add_argument("--scorer-epochs", type=int, default=3)
    ap.add_argument("--scorer-batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=1200, help="training batches of each arm")
    ap.add_argument("--batch", type=int, default=64, help="global batch of each arm")
    ap.add_argument("--n-prompts", type=int, default=1000, help="held-out prompts drawn by each model")
    ap.add_argument("--n-per-prompt", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = parse_args(ap, smoke=dict(n=48, n_eval=24, scorer_epochs=1, scorer_batch=16, batches=2, batch=8,
                                     n_prompts=8, n_per_prompt=1, steps=2, bootstrap=40))
    t0 = time.perf_counter()
    data, parts, scorer = build_data(args)
    from models.shapes.scorer import ShapesScorer

    scorer_info = ShapesScorer(scorer).info
    trained = {name: train_arm(name, buckets, data, parts, args) for name, buckets in ARMS.items()}
    rows = score_arms({name: ckpt for name, (ckpt, _) in trained.items()}, data, scorer, args)
    comparison = compare_arms(rows, args)
    by_frame = position_by_frame(rows, data, args)
    keys = ("attr_pair_position", "attr_single_count", "attr_single_shape", "attr_single_color", "attr_all_all", "fid")
    report("bucketed_vs_square", {
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "smoke")},
        "scorer_held_out": scorer_info.get("held_out"), "scorer_held_out_non_square": scorer_info.get("held_out_non_square"),
        "train_seconds": {name: round(s, 1) for name, (_, s) in trained.items()},
        "rows": {name: {k: row.get(k) for k in (*keys, "n_images", "size", "aspect", "attr_n_pair")}
                 for name, row in rows.items()},
        "bucketed_minus_square": {m["metric"]: {k: m[k] for k in ("a", "b", "difference", "lo", "hi", "p")}
                                  for m in comparison["metrics"] if m["metric"] in keys},
        "position_by_frame": {frame: {k: d[k] for k in ("images", "prompts", "a", "b", "difference", "lo", "hi", "p")}
                              for frame, d in by_frame.items()},
        "seconds": round(time.perf_counter() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
