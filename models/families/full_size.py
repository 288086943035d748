"""A family's parts at full size with no weights (on PyTorch's meta device): what they count and what they need
in memory at a precision, with nothing downloaded and nothing allocated."""
from __future__ import annotations

import importlib

from .family import Family, Part, Variant

BYTES_PER_PARAMETER = {"float32": 4, "bfloat16": 2, "float16": 2}


def build_on_meta(part: Part):
    """The part's model with every tensor on the meta device."""
    import torch

    cls = getattr(importlib.import_module(part.library), part.cls)
    with torch.device("meta"):
        if part.library == "transformers":
            config_cls = cls.config_class
            return cls(config_cls(**part.config))
        return cls.from_config(part.config)


def parameter_counts(variant: Variant) -> dict[str, int]:
    """Each part's parameter count at full size."""
    return {name: sum(p.numel() for p in build_on_meta(part).parameters()) for name, part in variant.parts.items()}


def published_count(variant: Variant, counts: dict[str, int]) -> int:
    """The parts the published figure speaks of, counted: comparable with ``variant.published_parameters``."""
    return sum(counts[p] for p in (variant.published_parts or counts))


def full_size_summary(family: Family) -> list[dict]:
    """Per variant: each part's count, the published figure's parts counted, the figure, and the weights' size
    in bfloat16."""
    rows = []
    for variant in family.variants:
        counts = parameter_counts(variant)
        rows.append({"family": family.name, "variant": variant.name, "parts": counts,
                     "counted": published_count(variant, counts), "published": variant.published_parameters,
                     "bfloat16_gib": sum(counts.values()) * BYTES_PER_PARAMETER["bfloat16"] / 2**30})
    return rows
