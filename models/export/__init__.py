"""Checkpoints out to other tools: a diffusers folder's model card, the original single-file layouts (SD 1/2's
key maps, and SDXL's, SD3's and Flux.1's published ones, diffusers' converters read backwards) and the
export command's format choice. It stands on the checkpoint door."""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "export": "config_folder export_checkpoint export_format export_single_file",
    "model_card": "model_card_text",
    "original_layout": "original_config original_entries",
})
