"""The checkpoint door's own cost next to opening a checkpoint: full-size SD2-base with random weights.

For each kind a user has at full size (this project's Composer checkpoint, a diffusers folder, a
single-file ``.safetensors`` in the original layout), the door's work before any weight is read into a
model (``find_checkpoint``: what the file is and its step; ``content_hash``; ``describe``) is timed with the
door's in-process caches emptied, against ``load_pipeline`` (the door, then building the pipeline). The
files were just written, so both read from the page cache. Target: the door under 2% of opening.

    python bench/door_cost.py [--rounds 3]       # about 6 GB of RAM per copy of the model, 15 GB of disk
    python bench/door_cost.py --smoke            # the tiny checkpoint, for seconds
"""
from __future__ import annotations

import argparse
import statistics
import time

from _common import ROOT, RUN, parse_args, random_sd2_base, report, tiny_checkpoint


def full_size_checkpoints() -> dict[str, str]:
    """SD2-base (random weights) as a Composer checkpoint of this project, a diffusers folder and a single file."""
    import torch
    from composer import Trainer

    from tests.checkpoints.original_layout import write_single_file
    from train.config import load_config
    from models.checkpoints.spec import make_spec
    from train.callbacks.spec import ModelSpec
    from train.trainer import build_model

    out = RUN.out / "door-sd2"
    paths = {"composer": out / "sd2-base-rank0.pt", "diffusers": out / "sd2-base-folder",
             "single-file": out / "sd2-base.safetensors"}
    if all(p.exists() for p in paths.values()):
        return {k: str(p) for k, p in paths.items()}
    out.mkdir(parents=True, exist_ok=True)
    pipe = random_sd2_base(["a photo of a cat", "two red circles left of a blue square"])
    pipe.save_pretrained(paths["diffusers"], safe_serialization=True)
    write_single_file(pipe, paths["single-file"], "sd2", prediction_type="epsilon")
    cfg = load_config(ROOT / "configs/sd2-base-phase1.yaml", ["model.pretrained=null"])
    model = build_model(cfg)
    for name in ("unet", "vae", "text_encoder"):
        getattr(model, name).load_state_dict(getattr(pipe, name).state_dict())
    model.tokenizer = pipe.tokenizer
    trainer = Trainer(model=model, max_duration="1ba", device="cpu", progress_bar=False, log_to_console=False,
                      callbacks=[ModelSpec(make_spec(model, "sd2-base", 512))],
                      optimizers=torch.optim.AdamW(model.unet.parameters()))
    trainer.save_checkpoint(str(paths["composer"]))
    trainer.close()
    return {k: str(p) for k, p in paths.items()}


def clear_door_caches() -> None:
    from models.checkpoints import composer, find, hashing, single_file
    from models.readers import ziphead

    find._kinds.clear()
    hashing._cache.clear()
    single_file._cached_shapes.cache_clear()
    ziphead._read.cache_clear()
    composer._summary.cache_clear()


def time_door(ref: str) -> float:
    from models.checkpoints import content_hash, describe, find_checkpoint

    clear_door_caches()
    t = time.perf_counter()
    ckpt = find_checkpoint(ref)
    content_hash(ckpt)
    describe(ckpt)
    return time.perf_counter() - t


def time_open(ref: str) -> float:
    import gc

    from models.checkpoints import load_pipeline

    clear_door_caches()
    t = time.perf_counter()
    pipe = load_pipeline(ref)
    seconds = time.perf_counter() - t
    del pipe
    gc.collect()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = parse_args(ap, smoke=dict(rounds=1))
    refs = {"composer (tiny)": str(tiny_checkpoint())} if RUN.smoke else full_size_checkpoints()
    results = {}
    for kind, ref in refs.items():
        time_door(ref)  # imports (diffusers' single-file code, Composer's) are not the door's per-checkpoint cost
        doors, opens = [], []
        for _ in range(args.rounds):  # side by side, alternating
            doors.append(time_door(ref))
            opens.append(time_open(ref))
        door, opened = statistics.median(doors), statistics.median(opens)
        results[kind] = {"door_s": round(door, 4), "open_s": round(opened, 2), "door_share": round(door / opened, 4),
                         "door_s_all": [round(d, 4) for d in doors], "open_s_all": [round(o, 2) for o in opens]}
        if not door < opened:
            raise SystemExit(f"{kind}: the door ({door:.3f} s) took longer than opening ({opened:.3f} s)")
    report("door_cost", {"rounds": args.rounds, "kinds": results, "target_door_share": 0.02})


if __name__ == "__main__":
    main()
