"""Checkpoints out to other tools: a diffusers folder's model card, the original single-file layouts (SD 1/2's
key maps, and SDXL's, SD3's and Flux.1's published ones, diffusers' converters read backwards) and the
export command's format choice. It stands on the checkpoint door."""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "adapter_export": "adapter_of export_adapter",
    "export": "config_folder export_checkpoint export_format export_single_file single_file_readers",
    "model_card": "model_card_text",
    "original_layout": "original_config original_entries",
})
