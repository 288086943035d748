"""Prompt sets of the shapes domain: held-out captions, as the dataset writes them."""
from __future__ import annotations

from .dataset import sample_meta


def shapes_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """The captions of the first ``n`` held-out samples and their category ("one group" or "two groups")."""
    prompts = []
    for i in range(n):
        caption, meta = sample_meta(seed, "eval", i)
        prompts.append((caption, "two groups" if meta["relation"] else "one group"))
    return prompts
