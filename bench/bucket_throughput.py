"""Training on aspect-ratio buckets against square crops at the same pixel budget: images/s and pixels/s of the
tiny UNet's Composer training step, side by side in one run.

The same images of mixed aspect ratios (photos, screens, portraits, squares: convert_aspect.py's mix), converted
by `dwb data convert` at --side px twice, and read three ways:
  buckets         `--aspect-buckets`, in its buckets (every batch from one bucket, images at their stored size);
  square          the square conversion (shorter side --side), in square crops of --side: training without buckets;
  bucket_squares  the bucketed conversion in square crops of --side (`data.aspect_buckets: false`: each image
                  resized and cropped by the loader).
No bucket holds more pixels than the square. The three alternate, --rounds times each (the CPU is shared: the
ratios carry, not the absolute figures); the first --warm batches of each run are not timed.

    python bench/bucket_throughput.py [--side 64 --images 1200 --batches 30 --rounds 2]
    python bench/bucket_throughput.py --smoke
"""
from __future__ import annotations

import argparse
import time

from _common import ROOT, RUN, fixtures, parse_args, report
from convert_aspect import RATIOS


def source_images(folder, images: int, side: int) -> None:
    """``images`` PNGs with captions, of RATIOS' mix, their shorter side 1.25 to 2 budgets."""
    import numpy as np
    from PIL import Image

    if (folder / "done").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    ratios, weights = zip(*RATIOS)
    rng = np.random.default_rng(0)
    for i in range(images):
        ratio = ratios[rng.choice(len(ratios), p=np.array(weights) / sum(weights))]
        short = int(rng.integers(side * 5 // 4, side * 2))
        w, h = (round(short * ratio), short) if ratio >= 1 else (short, round(short / ratio))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:05d}.png")
        (folder / f"{i:05d}.txt").write_text(f"a red circle {i}")
    (folder / "done").write_text("")


def converted(images: int, side: int, step: int | None):
    """The budget folder of the sources converted with aspect-ratio buckets on ``step``, or square (None)."""
    from train.data import convert_to_mds

    out = RUN.out / f"bucket-throughput-{images}-{side}-{'square' if step is None else step}"
    if not (out / ".convert" / "summary.json").is_file():
        source_images(RUN.out / f"bucket-sources-{images}-{side}", images, side)
        convert_to_mds(RUN.out / f"bucket-sources-{images}-{side}", out, buckets=(side,),
                       aspect_buckets=step is not None, bucket_step=step, image_format="png", workers=1,
                       progress=False)
    return out / str(side)


def timed_run(folder, parts, side: int, batch: int, batches: int, warm: int, buckets: bool) -> dict:
    """Images/s and pixels/s over the batches after ``warm`` of one training run."""
    from composer.core import Callback

    from train.config import load_config
    from train.trainer import build_trainer

    class Clock(Callback):
        def __init__(self):
            self.ends, self.pixels = [], []

        def after_dataloader(self, state, logger):
            n, _, h, w = state.batch["image"].shape
            self.pixels.append(n * h * w)

        def batch_end(self, state, logger):
            self.ends.append(time.perf_counter())

    trainer = build_trainer(load_config(ROOT / "configs/tiny-phase1.yaml", [
        f"model.pretrained={parts}", f"data.path={folder}", f"data.resolution={side}",
        f"data.aspect_buckets={str(buckets).lower()}", f"save_folder={RUN.out / 'bucket-throughput-ckpt'}",
        "save_interval=100000ba", "autoresume=false", f"global_train_batch_size={batch}",
        f"device_train_microbatch_size={batch}", "progress_bar=false", "loggers=[]", "eval_interval=null",
        "preview_interval=null", "scheduler.t_warmup=1ba"]))
    clock = Clock()
    trainer.state.callbacks.append(clock)
    trainer.fit(duration=f"{batches}ba")
    trainer.close()
    seconds = clock.ends[-1] - clock.ends[warm - 1]
    timed = clock.pixels[warm:len(clock.ends)]
    return {"images_per_s": batch * len(timed) / seconds, "pixels_per_s": sum(timed) / seconds,
            "pixels_per_image": sum(timed) / (batch * len(timed))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=64, help="the pixel budget (and the square side)")
    ap.add_argument("--step", type=int, default=8, help="the bucket step")
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = parse_args(ap, {"side": 32, "images": 48, "batch": 8, "batches": 4, "warm": 1, "rounds": 1})
    _, parts = fixtures()
    folders = {"buckets": converted(args.images, args.side, args.step),
               "square": converted(args.images, args.side, None)}
    folders["bucket_squares"] = folders["buckets"]
    runs = {name: [] for name in folders}
    for _ in range(args.rounds):
        for name, folder in folders.items():
            runs[name].append(timed_run(folder, parts, args.side, args.batch, args.batches, args.warm,
                                        name == "buckets"))
    best = {name: max(r, key=lambda x: x["images_per_s"]) for name, r in runs.items()}
    assert best["buckets"]["pixels_per_image"] <= best["square"]["pixels_per_image"] == args.side ** 2
    report("bucket_throughput", {
        "side": args.side, "step": args.step, "images": args.images, "batch": args.batch, "batches": args.batches,
        "warm": args.warm, "rounds": args.rounds, "runs": runs, "best": best,
        **{f"{what}_ratio_to_{name}": best["buckets"][what] / best[name][what]
           for name in ("square", "bucket_squares") for what in ("images_per_s", "pixels_per_s")},
    })


if __name__ == "__main__":
    main()
