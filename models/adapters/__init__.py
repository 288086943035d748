"""Adapters (LoRA, DoRA, LoHa, LoKr) on a family's denoiser through peft, and the one adapter file each reader
takes: what the trainer adds, `dwb export` writes and the app reads (docs/adapters.md: formats x families x loaders).

- ``presets``: each family's target modules, rank, alpha and dropout, and where they come from;
- ``adding``: ``add_adapter``, peft's layers on a UNet2DConditionModel, SD3Transformer2DModel or FluxTransformer2DModel;
- ``writing``: ``write_adapter``, one safetensors file in the ``diffusers``, ``kohya`` or ``peft`` layout;
- ``kohya``: kohya's key names (Flux.1's fused layers), its ``ss_*`` metadata and AUTOMATIC1111's hashes;
- ``reading``: ``check_adapter_file``, an adapter file from elsewhere judged from its header against the
  denoiser and the text encoders before any tensor is read;
- ``applying``: ``apply_adapters``, adapter files of every layout and kind (LoRA, DoRA, LoHa, LoKr) applied to an
  opened pipeline at a strength each, judged first;
- ``sizing``: ``adapter_size``, an adapter's parameters and file size on a full-size denoiser, built on the meta
  device.
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "applying": "AppliedAdapter a1111_short_hash adaptable_copy adaptable_text_encoders apply_adapters "
                "judge_adapter_file parse_adapter_arg",
    "adding": "MAX_RANK adapter_config add_adapter denoiser_layers is_adapter_key",
    "kohya": "KOHYA_FAMILIES KOHYA_TEXT_PREFIXES fused_lora kohya_hashes",
    "presets": "KINDS PRESETS Preset preset_of",
    "reading": "AdapterFile MAX_ADAPTER_BYTES check_adapter_file",
    "sizing": "AdapterSize adapter_size variant_of_hub_id",
    "writing": "LAYOUTS adapter_kind adapter_layers lora_weights write_adapter",
})
