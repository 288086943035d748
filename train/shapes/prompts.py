"""Prompt sets of the shapes domain: held-out captions, as the dataset writes them."""
from __future__ import annotations

from .dataset import framed_prompts


def shapes_prompts(n: int, seed: int = 0, wide: float = 0.0) -> list[tuple[str, str]]:
    """The captions of the first ``n`` held-out samples and their category ("one group" or "two groups")."""
    return [(caption, category) for caption, category, _ in framed_prompts(n, seed, wide)]
