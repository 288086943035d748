"""What an adapter adds to each family's denoiser when nobody says otherwise: the modules it targets (peft's
``target_modules``: a name matches a module whose path ends with it), its rank, alpha and dropout.

Where the values come from (read in the sources, docs/adapters.md lists the commits):

- the UNets (SD 1.x, SD 2.x, SDXL): diffusers' ``train_dreambooth_lora_sdxl.py`` targets the attention
  projections ``to_k, to_q, to_v, to_out.0``; ``train_dreambooth_lora.py`` adds ``add_k_proj, add_v_proj``, which
  only UNets with added key/value attention hold (none of these families), so the two lists adapt the same layers.
  kohya's sd-scripts (``networks/lora.py``) adapts every Linear inside a ``Transformer2DModel`` instead (the
  attention, feed-forward and ``proj_in``/``proj_out``): pass ``targets`` for that;
- SD3: ``train_dreambooth_lora_sd3.py``'s default, both streams' attention projections;
- Flux.1: ``train_dreambooth_lora_flux.py``'s default, both streams' attention projections and feed-forwards
  (``attn.to_q`` also names the single blocks' query projections);
- rank 4 with alpha equal to it (a scale of 1) and no dropout: every diffusers script above (``--rank`` defaults
  to 4, ``lora_alpha=args.rank``, ``--lora_dropout`` 0.0). kohya defaults to rank 4 with alpha 1 (a scale of 0.25).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import WorkbenchError

KINDS = ("lora", "dora", "loha", "lokr")
UNET_ATTENTION = ("to_k", "to_q", "to_v", "to_out.0")
MMDIT_ATTENTION = ("attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "attn.to_k",
                   "attn.to_out.0", "attn.to_q", "attn.to_v")
FLUX_TARGETS = ("attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                "ff_context.net.2")


@dataclass(frozen=True)
class Preset:
    targets: tuple[str, ...]
    rank: int = 4
    alpha: float = 4.0
    dropout: float = 0.0
    source: str = ""


PRESETS = {
    "sd1": Preset(UNET_ATTENTION, source="diffusers examples/dreambooth/train_dreambooth_lora_sdxl.py"),
    "sd2": Preset(UNET_ATTENTION, source="diffusers examples/dreambooth/train_dreambooth_lora_sdxl.py"),
    "sdxl": Preset(UNET_ATTENTION, source="diffusers examples/dreambooth/train_dreambooth_lora_sdxl.py"),
    "sd3": Preset(MMDIT_ATTENTION, source="diffusers examples/dreambooth/train_dreambooth_lora_sd3.py"),
    "flux": Preset(FLUX_TARGETS, source="diffusers examples/dreambooth/train_dreambooth_lora_flux.py"),
}


def preset_of(family: str) -> Preset:
    """The preset of the family named ``family`` (``sd1``, ``sd2``, ``sdxl``, ``sd3``, ``flux``)."""
    if family not in PRESETS:
        raise WorkbenchError(f"no adapter preset for the family {family!r}; the families are: {', '.join(PRESETS)}")
    return PRESETS[family]
