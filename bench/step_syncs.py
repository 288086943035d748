"""The training step before and after its avoidable host syncs were removed, timed side by side on this machine.

The before-path is kept here as the code was, to be timed beside the new one:
- draws (``randomness: per_sample``): one CPU generator per sample, the batch's epochs and ids read with tolist();
- the non-finite guard: ``bool(isfinite(loss))`` after each microbatch, a norm pass over the gradients besides
  Composer's GradientClipping, ``.item()`` of the all-reduced flag every step, non-fused AdamW;
- images: float32 in [-1, 1] from the loader.
The after-path is the workbench's: Philox draws where the batch is, the guard folded into clipping's norm with the
skip handed to a fused AdamW, uint8 images normalised in the model.

Timed, alternating before and after, medians:
1. one microbatch's per-sample draws (posterior noise, caption dropout, noise, timestep) at the tiny config's size
   (64 x 4x8x8 latents) and at SDXL-1024's (16 x 4x128x128);
2. the guard's work at the end of a step on the tiny UNet's gradients (clipping included in both);
3. the step: ``--steps`` batches of configs/tiny-phase2.yaml (32 px, batch 64, EMA) with ``randomness: per_sample``
   through Composer, each path built fresh per round;
and the bytes of one batch of images as each path ships it, at 32 px x 64 and at SDXL's 1024 px x 16.
On a CPU a host sync costs nothing (there is no queue to wait for): what the step measures here is the work moved;
what the syncs cost on a GPU is reasoned in BENCHMARKS.md.

  python bench/step_syncs.py [--steps 20] [--rounds 3] [--repeats 20]
  python bench/step_syncs.py --smoke        # seconds: 2 steps, 1 round, 2 repeats
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager, nullcontext

from _common import ROOT, RUN, fit_batch_end_times, fixtures, parse_args, report

NAME = "step_syncs"
SMOKE = {"steps": 2, "rounds": 1, "repeats": 2}


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"{NAME}: check failed: {what}")


class OldDraws:
    """The per-sample draws as they were: one CPU generator per sample, keyed from ids read back with tolist()."""

    def __init__(self, generators=None):
        self.generators = generators

    @property
    def per_sample(self) -> bool:
        return self.generators is not None

    @classmethod
    def of_batch(cls, batch: dict, seed):
        import torch

        if seed is None or "sample_id" not in batch:
            return cls()
        keys = zip(batch["epoch"].tolist(), batch["sample_id"].tolist())
        return cls([torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 2_147_483_647 + index)
                    for epoch, index in keys])

    def uniform(self, n, device):
        import torch

        return torch.stack([torch.rand((), generator=g) for g in self.generators]).to(device)

    def normal(self, shape, device, dtype):
        import torch

        return torch.stack([torch.randn(shape[1:], generator=g) for g in self.generators]).to(device, dtype)

    def timesteps(self, high, n, device):
        import torch

        return torch.cat([torch.randint(0, high, (1,), generator=g) for g in self.generators]).to(device)


def old_guard(limit: int, clip_norm: float | None):
    """The guard as it was (its check read on the host every microbatch and step), then Composer's clipping."""
    import torch
    from composer.algorithms.gradient_clipping.gradient_clipping import apply_gradient_clipping
    from composer.core import Algorithm, Event

    from models.common import all_reduce

    class OldGuard(Algorithm):
        def __init__(self):
            self.skipped = self.consecutive = 0
            self._bad_loss = False

        def match(self, event, state):
            return event in (Event.BATCH_START, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH)

        def apply(self, event, state, logger):
            if event == Event.BATCH_START:
                self._bad_loss = False
            elif event == Event.AFTER_BACKWARD:
                self._bad_loss = self._bad_loss or not bool(torch.isfinite(state.loss.detach()).all())
            else:
                grads = [p.grad for p in state.model.parameters() if p.grad is not None]
                bad = self._bad_loss
                if grads and not bad:
                    bad = not bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())
                flag = torch.tensor([1.0 if bad else 0.0], device=grads[0].device if grads else "cpu")
                all_reduce(flag, "max")
                if flag.item() > 0:
                    for p in state.model.parameters():
                        p.grad = None
                    self.skipped += 1
                self.consecutive = self.consecutive + 1 if flag.item() > 0 else 0
                if clip_norm is not None:  # Composer's GradientClipping, the next algorithm at the same event
                    apply_gradient_clipping(state.model, "norm", clip_norm, fsdp_enabled=False)
                logger.log_metrics({"train/nonfinite_skipped": self.skipped})

    return OldGuard()


@contextmanager
def old_path():
    """The workbench with the before-path's draws, guard, optimizer and image batches put back."""
    import numpy as np
    import torch

    import train.data.loader as loader
    import train.guard as guard
    import train.recipes.latent_diffusion as latent_diffusion
    import train.trainer as trainer

    kept = (latent_diffusion.Draws, guard.NonFiniteGuard, trainer.make_optimizer, loader.channels_first)
    latent_diffusion.Draws = OldDraws
    guard.NonFiniteGuard = lambda limit, clip_norm=None, read_every=1: old_guard(limit, clip_norm)
    trainer.make_optimizer = lambda cfg, model: torch.optim.AdamW(
        model.denoiser.parameters(), lr=cfg.optimizer.lr, betas=tuple(cfg.optimizer.betas), eps=cfg.optimizer.eps,
        weight_decay=cfg.optimizer.weight_decay)
    loader.channels_first = lambda pixels: loader.model_range(torch.from_numpy(np.ascontiguousarray(pixels))
                                                              .movedim(-1, -3))
    try:
        yield
    finally:
        latent_diffusion.Draws, guard.NonFiniteGuard, trainer.make_optimizer, loader.channels_first = kept


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def draws_cost(batch: int, latent: tuple, repeats: int) -> dict:
    """Seconds of one microbatch's per-sample draws, each path, alternating."""
    import torch

    from train.recipes import Draws

    ids, epoch = torch.arange(10_000, 10_000 + batch), torch.zeros(batch, dtype=torch.long)
    shape = (batch, *latent)

    def forward(cls):
        draws = cls.of_batch({"sample_id": ids, "epoch": epoch}, 17)
        draws.normal(shape, "cpu", torch.float32), draws.uniform(batch, "cpu")
        draws.normal(shape, "cpu", torch.float32), draws.timesteps(1000, batch, "cpu")

    before, after = [], []
    for _ in range(repeats):
        before.append(timed(lambda: forward(OldDraws)))
        after.append(timed(lambda: forward(Draws)))
    return {"batch": batch, "latents": list(latent), "before_ms": round(1e3 * statistics.median(before), 2),
            "after_ms": round(1e3 * statistics.median(after), 2)}


def guard_cost(repeats: int) -> dict:
    """Seconds of the guard's end-of-step work (clipping included) on the tiny UNet's gradients, each path."""
    import torch
    from composer.core import Event, State
    from composer.devices import DeviceCPU
    from composer.loggers import Logger

    from models.checkpoints import build_unet
    from train.guard import NonFiniteGuard

    unet = build_unet("tiny")
    for p in unet.parameters():
        p.grad = torch.randn_like(p)
    state = State(model=unet, rank_zero_seed=0, run_name=NAME, device=DeviceCPU(), precision="fp32",
                  optimizers=torch.optim.AdamW(unet.parameters(), fused=True))
    state.loss = torch.tensor(1.0)
    logger = Logger(state)
    guards = {"before": old_guard(10, 1.0), "after": NonFiniteGuard(10, clip_norm=1.0, read_every=10)}
    times = {k: [] for k in guards}
    for _ in range(repeats):
        for name, guard in guards.items():
            guard.apply(Event.BATCH_START, state, logger)
            guard.apply(Event.AFTER_BACKWARD, state, logger)
            times[name].append(timed(lambda: guard.apply(Event.AFTER_TRAIN_BATCH, state, logger)))
    check(guards["after"].skipped == 0, "the guard skipped a finite step")
    return {"weights": sum(p.numel() for p in unet.parameters()),
            **{f"{k}_ms": round(1e3 * statistics.median(v), 3) for k, v in times.items()}}


def image_bytes() -> dict:
    """Bytes of one batch of images as each path ships it."""
    sizes = {"tiny_32px_x64": (64, 32), "sdxl_1024px_x16": (16, 1024)}
    return {name: {"before_float32": n * 3 * side * side * 4, "after_uint8": n * 3 * side * side}
            for name, (n, side) in sizes.items()}


def step_cost(steps: int, rounds: int) -> dict:
    """Seconds per step of tiny-phase2 with per-sample draws, each path built fresh and fitted in turn."""
    from train.config import load_config
    from train.trainer import build_trainer

    data, parts = fixtures()
    over = [f"model.pretrained={parts}", f"data.path={data / '32'}", "load_path=null", "progress_bar=false",
            "loggers=[]", "save_interval=100000ba", "max_duration=100000ba", "randomness=per_sample",
            "eval_interval=null", "preview_interval=null", "scheduler.t_warmup=1ba"]
    per_step = {"before": [], "after": []}
    for r in range(rounds):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            cfg = load_config(ROOT / "configs/tiny-phase2.yaml",
                              over + [f"save_folder={RUN.out / NAME / name / str(r) / 'checkpoints'}"])
            with old_path() if name == "before" else nullcontext():
                trainer = build_trainer(cfg)
                ends = fit_batch_end_times(trainer, steps + 2)
            per_step[name] += [b - a for a, b in zip(ends[2:], ends[3:])] or [ends[-1] - ends[-2]]
    return {"config": "configs/tiny-phase2.yaml, randomness per_sample", "steps": steps, "rounds": rounds,
            **{f"{k}_seconds_per_step": round(statistics.median(v), 4) for k, v in per_step.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round and path")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of before and after, alternating")
    ap.add_argument("--repeats", type=int, default=20, help="repeats of each component's timing")
    args = parse_args(ap, SMOKE)
    import torch

    result = {"draws": [draws_cost(64, (4, 8, 8), args.repeats), draws_cost(16, (4, 128, 128), args.repeats)],
              "guard": guard_cost(args.repeats), "image_batch_bytes": image_bytes(),
              "step": step_cost(args.steps, args.rounds), "torch_threads": torch.get_num_threads()}
    report(NAME, result)


if __name__ == "__main__":
    main()
