"""Counter-based random numbers on any device: Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as
1, 2, 3"; Random123's ``philox4x32``), computed with torch integer ops, so that a draw is a pure function of its key
and counter: no generator state, nothing read back to the host, and the same words on a CPU and a GPU (uniforms bit
for bit; normals to the last bit of the devices' float log and cos).

Every word is an int64 tensor holding an unsigned 32-bit value. Philox multiplies two 32-bit words into 64 bits; the
multiplier is split into 16-bit halves so that no product passes 2^48 (int64 overflow is never relied on). Random123's
published known-answer vectors (tests/kat_vectors) hold it to the reference (tests/train/test_draws.py).

Uniforms take the top 24 bits of a word, centred in their interval: (x + 1/2) / 2^24, strictly inside (0, 1), exact in
float32. Normals come from two uniforms each by Box-Muller (r = sqrt(-2 ln u1), angle 2 pi u2; |z| < 5.9 by the
smallest u1).
"""
from __future__ import annotations

import math

import torch

MASK = 0xFFFFFFFF
M0, M1 = 0xD2511F53, 0xCD9E8D57  # Random123's PHILOX_M4x32_0 and _1
W0, W1 = 0x9E3779B9, 0xBB67AE85  # its key increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10


def mulhilo(word: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of ``word`` x ``multiplier`` (both below 2^32), each product below 2^48."""
    low_half = word * (multiplier & 0xFFFF)
    high_half = word * (multiplier >> 16)
    high = (high_half + (low_half >> 16)) >> 16
    low = (low_half + ((high_half & 0xFFFF) << 16)) & MASK
    return high, low


def philox4x32(counter: tuple, key: tuple, rounds: int = ROUNDS) -> tuple[torch.Tensor, ...]:
    """The four output words of Philox4x32-``rounds`` for four counter words and two key words (tensors that
    broadcast, or ints), in Random123's round and key schedule (the key bumped before every round but the first)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        hi0, lo0 = mulhilo(c0, M0)
        hi1, lo1 = mulhilo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def uniforms(words: torch.Tensor) -> torch.Tensor:
    """32-bit words -> float32 uniforms in (0, 1) from their top 24 bits."""
    return ((words >> 8).float() + 0.5) * 2.0**-24


def box_muller(u1: torch.Tensor, u2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent standard normals from two independent uniforms in (0, 1)."""
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = (2 * math.pi) * u2
    return radius * torch.cos(angle), radius * torch.sin(angle)


def sample_words(seed: int, epoch: torch.Tensor, index: torch.Tensor, stream: int, quads: int) -> torch.Tensor:
    """(B, 4 x quads) 32-bit words of each sample's ``stream``: key (seed, epoch), counter (quad, stream, index low,
    index high), for samples of ``epoch`` and dataset ``index`` ((B,) int64 tensors on the device drawn on)."""
    index = index.long().view(-1, 1)
    quad = torch.arange(quads, device=index.device, dtype=torch.long).view(1, -1)
    key = (seed & MASK, epoch.long().view(-1, 1) & MASK)
    words = philox4x32((quad, stream & MASK, index & MASK, (index >> 32) & MASK), key)
    return torch.stack(torch.broadcast_tensors(*words), dim=-1).reshape(index.shape[0], 4 * quads)


def normals_of(words: torch.Tensor, count: int) -> torch.Tensor:
    """(B, count) float32 standard normals from (B, W) words (W >= count, W even): one per word, in pairs."""
    u = uniforms(words)
    z0, z1 = box_muller(u[:, 0::2], u[:, 1::2])
    return torch.stack([z0, z1], dim=-1).reshape(u.shape[0], -1)[:, :count]
