"""Tuning the tiny MMDiT honestly: each variant is `configs/tiny-mmdit-phase{1,2}.yaml` with some keys changed,
trained on the demo's data and parts for the UNet's training FLOPs (counted, as the demo counts them), scored into
the demo's store as the demo scores, and compared by `dwb evaluate compare`'s paired intervals with the UNet's last
checkpoint and with the config's transformer.

Run after `dwb demo --with-transformer` (its data, parts, scorer and both recipes' scores are reused):

    .venv/bin/python bench/transformer_tuning.py --demo demo-output               # the variants below
    .venv/bin/python bench/transformer_tuning.py --demo demo-output --variant 'wide: model.transformer={"patch_size": 2, "attention_head_dim": 32}'

A variant that changes only phase-2 keys (lr, shift) starts from the config's phase-1 checkpoint, as
BENCHMARKS.md's first rows did; one that changes the denoiser (``model.transformer``) trains its own phase 1 (as
long as the config's) and then phase 2 for what is left of the UNet's FLOPs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import parse_args, report, RUN

# (name, key=value overrides of both phases); BENCHMARKS.md "The tiny transformer" has the results.
# A variant's model.transformer replaces the config's ({"patch_size": 2}) whole.
VARIANTS = (
    ("lr3e-3", ["optimizer.lr=3.0e-3"]),
    ("no-shift", ["model.flow_shift=1"]),
    ("patch1", ['model.transformer={"patch_size": 1}']),
    ("depth6", ['model.transformer={"patch_size": 2, "num_layers": 6}']),
    ("logit-std0.5", ["model.logit_std=0.5"]),
)
UNET_LAST, CONFIG_LAST = "phase2", "transformer-phase2"  # the demo's labels of the two recipes' phase 2


def variant(text: str) -> tuple[str, list[str]]:
    """``NAME: key=value; key=value`` as one argument (values may be JSON): the variant's name and its overrides."""
    name, _, rest = text.partition(":")
    keys = [k.strip() for k in rest.split(";") if k.strip()]
    if not name.strip() or not keys or any("=" not in k for k in keys):
        raise argparse.ArgumentTypeError(f"a variant is 'NAME: key=value; key=value', got {text!r}")
    return name.strip(), keys


def last_of(scores: list[dict], prefix: str) -> str:
    """The label of the last scored checkpoint of a phase folder (``prefix/ba<N>``)."""
    rows = [s for s in scores if s["model"].split("/")[0] == prefix]
    return max(rows, key=lambda s: s["step"])["model"]


def train_variant(demo: Path, p: dict, seed: int, quick: bool, name: str, keys: list[str]) -> tuple[Path, int]:
    """Train the variant's phases (phase 1 only when its denoiser differs) for the UNet's FLOPs; its phase-2 folder
    and batches."""
    from demo.run import checkpoints, equal_flops_phase2, phase_config, training_flops
    from train.trainer import batch_count, train

    budget = equal_flops_phase2(demo, p, seed, quick)
    ours = {**p, "train": p["train"] + keys}
    own_phase1 = any(k.startswith("model.transformer") for k in keys)
    start = checkpoints(demo / "runs" / "tiny-mmdit-phase1" / "checkpoints")[-1].path
    if own_phase1:
        cfg = phase_config(demo, ours, seed, quick, "tiny-mmdit", "phase1", precomputed=False)
        cfg.save_folder, cfg.run_name = str(demo / "runs" / f"{name}-phase1" / "checkpoints"), f"{name}-phase1"
        start = checkpoints(Path(train(cfg)))[-1].path
    first = training_flops(demo, ours, seed, quick, "tiny-mmdit",
                           {"phase1": batch_count(phase_config(demo, ours, seed, quick, "tiny-mmdit", "phase1", False).max_duration)})
    phase2 = max(1, round((budget["unet_flops"] - first) / training_flops(demo, ours, seed, quick, "tiny-mmdit", {"phase2": 1})))
    cfg = phase_config(demo, ours, seed, quick, "tiny-mmdit", "phase2", precomputed=False)
    cfg.save_folder, cfg.run_name, cfg.load_path = str(demo / "runs" / name / "checkpoints"), name, str(start)
    cfg.max_duration = cfg.save_interval = f"{phase2}ba"
    return Path(train(cfg)), phase2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, help="a `dwb demo --with-transformer` output folder (default demo-output; "
                                              "with --smoke a quick one is made)")
    ap.add_argument("--variant", type=variant, action="append", help="'NAME: key=value; ...' (repeatable; default: "
                                                                     + ", ".join(n for n, _ in VARIANTS) + ")")
    args = parse_args(ap, smoke={})
    from demo.run import compare_models, score_checkpoints
    from demo.settings import FULL, QUICK

    quick, seed = RUN.smoke, 0
    demo = args.demo or (RUN.out / "demo" if quick else Path("demo-output"))
    if quick and not (demo / "demo.json").is_file():
        from demo.run import run_demo

        run_demo(demo, quick=True, seed=seed, with_transformer=True)
    made = json.loads((demo / "demo.json").read_text())
    if "transformer" not in made:
        sys.exit(f"{demo} was made without --with-transformer: run `dwb demo --with-transformer` first")
    p = QUICK if quick else FULL
    res = made["scores"][-1]["size"]
    unet = last_of(made["scores"], UNET_LAST)
    config = last_of(made["transformer"]["scores"], CONFIG_LAST)
    rows = []
    for name, keys in args.variant or (VARIANTS[:1] if quick else VARIANTS):
        folder, batches = train_variant(demo, p, seed, quick, name, keys)
        scores = score_checkpoints(demo, {name: folder}, {name: res, "phase2": res}, n_prompts=p["score_prompts"],
                                   steps=p["steps"], seed=seed, progress=not quick)
        ours = scores[-1]["model"]
        rows.append({"variant": name, "keys": keys, "phase2_batches": batches, "scores": scores[-1],
                     "against_unet": compare_models(demo, unet, ours, seed)[0],
                     "against_config": compare_models(demo, config, ours, seed)[0]})
    report("transformer_tuning", {"demo": str(demo), "unet": unet, "config": config, "variants": rows})


if __name__ == "__main__":
    main()
