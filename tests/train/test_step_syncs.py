"""The training step without reads back to the host: per-sample draws are Philox4x32-10 computed where the batch is
(Random123's known answers; each sample's numbers whatever batch, microbatch or rank it is in; standard normals and
uniforms by scipy's tests); the non-finite guard folds its check into gradient clipping's norm (the same gradients as
Composer's ``GradientClipping``), hands the skip to the fused AdamW on the device and reads its counters once a log
interval; images travel from the loader as uint8 and become the latents float32 pixels made.

A tensor on the meta device has no data: reading it back raises. Run on the meta device, code that reads nothing back
runs through, and the first read is where it stops."""
from pathlib import Path

import numpy as np
import pytest
import torch
from composer.core import Event, State
from composer.devices import DeviceCPU
from composer.loggers import Logger

from models.errors import WorkbenchError
from train.guard import NonFiniteGuard
from train.recipes import Draws
from train.recipes.philox import philox4x32

from ..conftest import REPO, tiny_overrides

# Random123's tests/kat_vectors, its three "philox4x32 10" lines: counter (4 words), key (2 words) -> output (4 words)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_gives_random123s_known_answers():
    words = lambda values: tuple(torch.tensor([v]) for v in values)  # noqa: E731
    for counter, key, expected in KNOWN_ANSWERS:
        assert tuple(int(w) for w in philox4x32(words(counter), words(key))) == expected


def _draw_all(draws: Draws, device="cpu") -> list[torch.Tensor]:
    """One forward's draws in a model's order: posterior noise, caption dropout, noise, timesteps."""
    n = len(draws.index)
    return [draws.normal((n, 4, 8, 8), device, torch.float32), draws.uniform(n, device),
            draws.normal((n, 4, 8, 8), device, torch.float32), draws.timesteps(1000, n, device)]


def test_a_samples_draws_are_the_same_in_any_batch_microbatch_or_rank():
    ids = torch.arange(1000, 1016)
    epoch = torch.full_like(ids, 3)
    whole = _draw_all(Draws(17, epoch, ids))
    splits = [[range(0, 5), range(5, 16)], [range(r, 16, 4) for r in range(4)]]  # microbatches; rank r of 4
    for split in splits:
        for part in split:
            rows = list(part)
            for got, want in zip(_draw_all(Draws(17, epoch[rows], ids[rows])), whole):
                assert torch.equal(got, want[rows])
    other = {"epoch": _draw_all(Draws(17, epoch + 1, ids)), "seed": _draw_all(Draws(18, epoch, ids))}
    for draws in other.values():
        assert not torch.equal(draws[0], whole[0]) and not torch.equal(draws[2], whole[2])
    assert not torch.equal(whole[0], whole[2])  # each call draws from its own stream


def test_per_sample_draws_follow_their_distributions():
    from scipy import stats

    ids = torch.arange(50_000)
    draws = Draws(5, torch.zeros_like(ids), ids)
    normals = draws.normal((len(ids), 4), "cpu", torch.float32).flatten().double().numpy()
    assert stats.kstest(normals, "norm").pvalue > 1e-4
    pairs = normals.reshape(-1, 2)  # Box-Muller's two normals of one pair are independent
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 5 / np.sqrt(len(pairs))
    uniform = draws.uniform(len(ids), "cpu").double().numpy()
    assert stats.kstest(uniform, "uniform").pvalue > 1e-4 and 0 < uniform.min() and uniform.max() < 1
    counts = np.bincount(draws.timesteps(1000, len(ids), "cpu").numpy() // 100, minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_per_sample_draws_read_nothing_back_to_the_host():
    """On the meta device (no data) every draw of a forward is computed: nothing was read to choose it."""
    ids = torch.arange(8, device="meta")
    draws = Draws.of_batch({"sample_id": ids, "epoch": torch.zeros_like(ids)}, seed=17)
    drawn = _draw_all(draws, "meta")
    assert [tuple(t.shape) for t in drawn] == [(8, 4, 8, 8), (8,), (8, 4, 8, 8), (8,)] and all(t.is_meta for t in drawn)


def _state(model: torch.nn.Module) -> State:
    return State(model=model, rank_zero_seed=0, run_name="guard", device=DeviceCPU(), precision="fp32",
                 optimizers=torch.optim.AdamW(model.parameters(), lr=0.1, fused=True))


def _step(guard: NonFiniteGuard, state: State, loss: torch.Tensor) -> None:
    state.loss = loss
    for event in (Event.BATCH_START, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH):
        guard.apply(event, state, Logger(state))


def test_the_guard_reads_its_counters_once_a_log_interval():
    """Four steps of a meta model with the counters read every 5 batches run through; the fifth reads them."""
    with torch.device("meta"):
        model = torch.nn.Linear(4, 3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    state, guard = _state(model), NonFiniteGuard(limit=10, clip_norm=1.0, read_every=5)
    for _ in range(4):
        _step(guard, state, torch.ones((), device="meta"))
    assert state.optimizers[0].found_inf.is_meta  # the skip decision went to the optimizer unread
    with pytest.raises(NotImplementedError, match="meta"):
        _step(guard, state, torch.ones((), device="meta"))


def test_the_guard_clips_as_composer_and_the_fused_adamw_skips_a_nonfinite_step():
    from composer.algorithms.gradient_clipping.gradient_clipping import apply_gradient_clipping

    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    theirs.load_state_dict(ours.state_dict())
    for a, b in zip(ours.parameters(), theirs.parameters()):
        a.grad = torch.randn_like(a) * 10
        b.grad = a.grad.clone()
    state, guard = _state(ours), NonFiniteGuard(limit=3, clip_norm=1.0, read_every=100)
    _step(guard, state, torch.tensor(2.0))
    apply_gradient_clipping(theirs, "norm", 1.0, fsdp_enabled=False)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours.parameters(), theirs.parameters()))

    optimizer = state.optimizers[0]
    optimizer.step()  # a finite batch: one update
    weights = [p.detach().clone() for p in ours.parameters()]
    moments = [optimizer.state[p]["exp_avg"].clone() for p in ours.parameters()]
    next(ours.parameters()).grad[0, 0] = float("nan")
    _step(guard, state, torch.tensor(2.0))
    optimizer.step()
    assert all(torch.equal(w, p) for w, p in zip(weights, ours.parameters()))
    assert all(torch.equal(m, optimizer.state[p]["exp_avg"]) for m, p in zip(moments, ours.parameters()))
    assert all(int(optimizer.state[p]["step"]) == 1 for p in ours.parameters())
    for p in ours.parameters():
        p.grad = torch.randn_like(p)
    _step(guard, state, torch.tensor(float("inf")))  # a non-finite loss with finite gradients: skipped too
    with pytest.raises(WorkbenchError, match="not finite for 3 batches in a row") as e:
        _step(guard, state, torch.tensor(float("nan")))  # the third in a row, read at once despite read_every
    assert "\n" not in str(e.value) and guard.skipped == 3


def test_images_travel_as_bytes_and_give_the_latents_float_pixels_gave(shapes_data, components):
    from train.config import load_config
    from train.data.loader import to_model_range
    from train.trainer import build_model, training_dataloader

    cfg = load_config(REPO / "configs/tiny-phase1.yaml", tiny_overrides(shapes_data, components, Path("unused")))
    model = build_model(cfg).eval()
    loader = training_dataloader(cfg, model)
    samples = [loader.dataset[i] for i in range(4)]
    images = loader.collate_fn(samples)["image"]
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16)
    floats = to_model_range(np.stack([s["image"] for s in samples]))  # what the loader shipped before
    assert images.nbytes * 4 == floats.nbytes
    torch.manual_seed(0)
    from_bytes = model.encode_images(images)
    torch.manual_seed(0)
    assert torch.equal(from_bytes, model.encode_images(floats))
