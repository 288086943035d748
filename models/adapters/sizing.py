"""What an adapter on a family's full-size denoiser adds, counted with nothing downloaded and nothing allocated: the
denoiser built on the meta device from the family's published config (``models.families.build_on_meta``), the adapter
added by peft as a run adds it, its weights counted; the file's size is those weights at the precision written plus
the safetensors header, which is a few kilobytes."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import WorkbenchError
from ..families import build_on_meta
from .adding import add_adapter, is_adapter_key

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class AdapterSize:
    family: str
    variant: str
    kind: str
    rank: int
    parameters: int  # the adapter's weights
    denoiser_parameters: int  # the base denoiser's, which the adapter leaves frozen and out of every file

    def file_bytes(self, dtype: str = "float32") -> int:
        """The adapter's weights at ``dtype`` (float32 as a run writes them; float16 or bfloat16 as many tools do)."""
        return self.parameters * BYTES[dtype]


def variant_of_hub_id(hub_id: str):
    """(family, variant) whose published hub id is ``hub_id``: what a config's ``model.init_from`` names."""
    from ..families import FAMILIES

    for family in FAMILIES:
        for variant in family.variants:
            if variant.hub_id == hub_id:
                return family, variant
    raise WorkbenchError(f"{hub_id} is no published model of the families ({', '.join(f.name for f in FAMILIES)})")


def adapter_size(hub_id: str, kind: str = "lora", rank: int | None = None, alpha: float | None = None,
                 targets=None) -> AdapterSize:
    """The adapter ``kind`` of ``rank`` (the family's preset where None) on the full-size denoiser of ``hub_id``."""
    return adapted_on_meta(hub_id, kind, rank, alpha, targets)[0]


def adapted_on_meta(hub_id: str, kind: str = "lora", rank: int | None = None, alpha: float | None = None,
                    targets=None):
    """(``adapter_size``'s figures, the adapted full-size denoiser on the meta device they were counted on)."""
    family, variant = variant_of_hub_id(hub_id)
    denoiser = build_on_meta(variant.parts[family.denoiser])
    base = sum(p.numel() for p in denoiser.parameters())
    config = add_adapter(denoiser, family.name, kind=kind, rank=rank, alpha=alpha, targets=targets)
    added = sum(p.numel() for name, p in denoiser.named_parameters() if is_adapter_key(name))
    return AdapterSize(family.name, variant.name, kind, config.r, added, base), denoiser
