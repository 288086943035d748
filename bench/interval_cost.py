"""Cost of the 95% intervals: one `dwb evaluate` row scored with --bootstrap 200 at 2048-d, the seconds the
intervals add, as a share of the rest of the row's scoring time.

The row: a tiny checkpoint (2 training batches: its quality does not matter), N shapes prompts (default
1,000), one image each at 32 px, DPM++ 2M, 20 steps, guidance 5, batch 64, FID and KID on a 2,048-d
Inception-v3 (torch-fidelity's architecture with random He-initialised weights: the cost is the
architecture's, not the weights'), N reference images, KID on subsets of min(N, 1,000). The row records
``seconds_bootstrap`` (prompt weights, the FID / KID replicates, quantiles, the per-category tables)
inside ``seconds_total``; the ratio is seconds_bootstrap / (seconds_total - seconds_bootstrap), both from
the same row, so measured side by side.

Then, on the row's saved features (``features.pt``): the reference's square root, the FID replicates
alone and the KID replicates alone, and ``--plain`` FID replicates computed the plain way (covariance of
the resampled set, then the general eigenvalues of S1 S2, as `frechet_distance`) on the same weights as
``FrechetReference.replicates``. Checks (exit status 1 when one fails): every interval holds its point,
a replicate with every weight 1 is the row's FID, and the plain replicates equal the fast ones.

  python bench/interval_cost.py [--images 1000] [--reference N] [--bootstrap 200] [--plain 2] [--out DIR]
  python bench/interval_cost.py --smoke      # seconds: 48 prompts, 64-d features, 4 steps, 20 replicates

Builds its data, components, checkpoint and random Inception once under OUT/interval-cost (default
bench/out; with --smoke, OUT/interval-cost-smoke in a temporary folder removed at exit) and writes
OUT/interval_cost.json; the last thing on stdout is that JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

NAME = "interval_cost"
SMOKE = {"images": 48, "reference": 64, "bootstrap": 20, "dim": 64, "steps": 4, "plain": 2}


def check(ok: bool, what: str) -> None:
    """An equality check of this benchmark: a failure ends the run with exit status 1 (asserts can be off)."""
    if not ok:
        raise SystemExit(f"{NAME}: check failed: {what}")


def fixtures(work: Path, n: int, vae_steps: int) -> tuple[Path, Path]:
    """(shapes dataset of ``n`` samples, tiny components): built once in ``work``, reused after."""
    from train.shapes.prepare import prepare_tiny
    from train.shapes import write_shapes_dataset

    data, parts = work / "shapes", work / "components"
    if not (data / "32" / "index.json").is_file():
        write_shapes_dataset(data, n, seed=0, sizes=(16, 32), n_eval=0, progress=False)
    if not (parts / "prepare.json").is_file():  # written last
        prepare_tiny(data, parts, vae_steps=vae_steps, max_images=min(n, 1024), progress=False)
    return data, parts


def tiny_checkpoint(data: Path, parts: Path, folder: Path) -> Path:
    """A tiny 32 px checkpoint after 2 batches of 16."""
    from train.config import load_config
    from train.trainer import train

    ckpt = folder / "ep0-ba2-rank0.pt"
    if not ckpt.is_file():
        train(load_config(ROOT / "configs/tiny-phase2.yaml", [
            f"model.pretrained={parts}", f"data.path={data / '32'}", "data.resolution=32", "load_path=null",
            f"save_folder={folder}", "max_duration=2ba", "save_interval=2ba", "global_train_batch_size=16",
            "device_train_microbatch_size=16", "progress_bar=false", "loggers=[]", "scheduler.t_warmup=1ba"]))
    return ckpt


def score_row(ckpt: Path, data: Path, weights: Path, out: Path, args) -> dict:
    """One (checkpoint, guidance) row, scored from scratch in ``out`` (the reference statistics too)."""
    from evaluate.run import EvalConfig, evaluate_checkpoints

    shutil.rmtree(out, ignore_errors=True)
    cfg = EvalConfig(out=str(out), reference=str(data / "32"), inception_weights=str(weights), prompts="shapes",
                     n_prompts=args.images, n_reference=args.reference, guidance=(5.0,), steps=args.steps,
                     sampler="DPM++ 2M", size=32, batch_size=64, kid_subset_size=min(1000, args.images),
                     inception_features=args.dim, bootstrap=args.bootstrap, device=args.device, progress=False)
    [row] = evaluate_checkpoints(cfg, [ckpt])
    check(row["n_images"] == args.images and row["bootstrap"] == args.bootstrap, f"row of {row['n_images']} images")
    for key in ("fid", "kid_mean"):
        check(row[f"{key}_lo"] <= row[key] <= row[f"{key}_hi"], f"{key}'s interval holds its point: {row}")
    return row


def timed(f, *a):
    t = time.perf_counter()
    value = f(*a)
    return value, time.perf_counter() - t


def plain_fid_replicates(ref, x: torch.Tensor, weights: np.ndarray) -> list[float]:
    """FID of each weighted set the plain way: the resampled set's covariance, then `frechet_distance`."""
    from evaluate.statistics.metrics import FeatureStats, fid_from_stats

    out = []
    for w in weights:
        resampled = FeatureStats(x.shape[1])
        resampled.update(torch.repeat_interleave(x.double(), torch.from_numpy(w).long(), dim=0))
        out.append(fid_from_stats(ref.stats, resampled))
    return out


def split_replicates(out: Path, row: dict, args) -> dict:
    """FID and KID replicates timed apart on the row's features; plain FID replicates beside them."""
    from evaluate.statistics.bootstrap import prompt_weights
    from evaluate.compare import load_references, load_row_images
    from evaluate.statistics.metrics import kid_replicates

    images, ref_files, _, _ = load_row_images(out, row)
    x, weights = images.features["fid"], prompt_weights(images.prompts, args.bootstrap, seed=0)
    ref = load_references({"fid": ref_files["fid"]})["fid"]
    frechet, sqrt_s = timed(lambda: ref.frechet)  # the reference's square root: once per reference set
    fast, fid_s = timed(frechet.replicates, x, weights)
    _, kid_s = timed(kid_replicates, ref.stats.features(), x, weights)
    [ones] = frechet.replicates(x, np.ones((1, len(x))))
    # float32 features against the row's float64 running sums
    check(abs(ones - row["fid"]) <= 1e-5 * abs(row["fid"]), f"all-ones replicate {ones} = row FID {row['fid']}")
    result = {"reference_sqrt_seconds": round(sqrt_s, 2), "fid_replicates_seconds": round(fid_s, 2),
              "kid_replicates_seconds": round(kid_s, 2), "fid_seconds_per_replicate": round(fid_s / args.bootstrap, 4),
              "distinct_images_per_replicate": round(float((weights > 0).sum(1).mean()), 1)}
    if args.plain:
        plain, plain_s = timed(plain_fid_replicates, ref, x, weights[:args.plain])
        for a, b in zip(plain, fast):  # the same distance, two ways
            check(abs(a - b) <= 1e-6 * max(abs(a), 1e-12), f"plain FID replicate {a} = fast {b}")
        result.update({"plain_fid_seconds_per_replicate": round(plain_s / args.plain, 2),
                       "plain_replicates_timed": args.plain,
                       "speedup_per_replicate": round(plain_s / args.plain / (fid_s / args.bootstrap), 1)})
    return result


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=1000, help="prompts (one image each) in the row")
    p.add_argument("--reference", type=int, help="reference images (default: as many as --images)")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates")
    p.add_argument("--dim", type=int, default=2048, choices=(64, 192, 768, 2048), help="Inception features")
    p.add_argument("--steps", type=int, default=20, help="sampler steps")
    p.add_argument("--plain", type=int, default=2, help="FID replicates also timed the plain way (0: none)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, help="folder for what it builds and its JSON (default bench/out; with "
                                            "--smoke a temporary folder, removed at exit)")
    p.add_argument("--smoke", action="store_true", help="a run of seconds on small sizes that checks the script "
                                                        "and its equality checks, not its figures")
    args = p.parse_args()
    if args.smoke:
        p.set_defaults(**SMOKE)  # an option given on the command line still wins
        args = p.parse_args()
        torch.set_num_threads(1)  # small problems: a second thread only waits on a busy 2-core machine
    args.reference = args.reference or args.images
    return args


def machine() -> str:
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def run(args, out: Path) -> dict:
    from evaluate.scorers.features import write_random_inception

    work = out / ("interval-cost-smoke" if args.smoke else "interval-cost")
    data, parts = fixtures(work, max(256, args.reference), vae_steps=2 if args.smoke else 20)
    ckpt = tiny_checkpoint(data, parts, work / "checkpoint")
    weights = write_random_inception(work / "inception-he")
    row = score_row(ckpt, data, weights, work / "eval", args)
    rest = row["seconds_total"] - row["seconds_bootstrap"]
    return {"benchmark": NAME, "smoke": args.smoke, "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "command": "python bench/interval_cost.py " + " ".join(sys.argv[1:]), "device": args.device,
            "images": row["n_images"], "reference": row["n_reference"], "features": args.dim,
            "bootstrap": args.bootstrap, "steps": args.steps,
            "row": {k: row[k] for k in ("seconds_generate", "seconds_metrics", "seconds_bootstrap", "seconds_total")},
            "ratio_bootstrap_to_rest_of_row": round(row["seconds_bootstrap"] / rest, 4),
            "fid": [row["fid"], row["fid_lo"], row["fid_hi"]], "fid_infinity": row["fid_infinity"],
            "replicates": split_replicates(work / "eval", row, args)}


def main() -> None:
    args = parse_args()
    out = args.out or (Path(tempfile.mkdtemp(prefix="interval-cost-")) if args.smoke else ROOT / "bench" / "out")
    try:
        result = run(args, out.resolve())
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{NAME}.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
    finally:
        if args.smoke and args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
