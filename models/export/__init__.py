"""Checkpoints out to other tools: a diffusers folder's model card, the original single-file layouts (SD 1/2's
key maps, and SDXL's, SD3's and Flux.1's published ones, diffusers' converters read backwards) and the
export command's format choice; an adapter checkpoint's adapter as a file (for `dwb export --layout`, and once per
version into a cache for the commands that apply it). It stands on the checkpoint door."""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "adapter_export": "adapter_of export_adapter",
    "adapter_files": "AdapterExports adapter_layout write_adapter_file",
    "export": "config_folder export_checkpoint export_format export_single_file single_file_readers",
    "model_card": "model_card_text",
    "original_layout": "original_config original_entries",
})
