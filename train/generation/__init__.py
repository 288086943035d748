"""Turning a checkpoint into images: one generation path, samplers, seeds, grids, prompt sets, device
choice, and the PNG parameters that record how each image was made.

- ``images``: prompts and per-image seeds to images (``generate_images``), for every caller;
- ``png``: the record of an image, written into its PNG (AUTOMATIC1111's ``parameters`` and JSON) and read back;
- ``samplers``: the samplers by name; ``device``: where a pipeline runs and in what precision;
- ``grid``: prompts x seeds grids; ``prompts``: prompt tables (DrawBench, PartiPrompts, your own CSV/TSV).
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "device": "pick_device pipeline_dtype",
    "grid": "DEMO_PROMPTS grid_image write_grid",
    "images": "DEFAULT_GUIDANCE Settings StepHook Stopped generate_images native_size sampler_of",
    "png": "ImageRecord as_one_line parse_parameters save_png settings_line with_metadata",
    "prompts": "PROMPT_SETS Prompt prompt_set_path read_prompt_table",
    "samplers": "DEFAULT_SAMPLER SAMPLERS check_sampler make_sampler sampler_name with_sampler_key",
})
