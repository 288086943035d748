"""Turning a checkpoint into images: one generation path, samplers, seeds, grids, prompt sets, device
choice, and the PNG parameters that record how each image was made.

- ``defaults``: guidance, steps, sampler, size and weights when nobody says otherwise, for every command, and
  the limits of what one image may ask for;
- ``images``: prompts and per-image seeds to images (``generate_images``), for every caller;
- ``modes``: what a generation starts from besides noise: an init image, a mask, a hires fix; images read bounded;
- ``prompt_weights``: AUTOMATIC1111's prompt weighting ((word:1.2), [word], BREAK) read within bounds and drawn
  through compel's embeddings, for the families compel conditions;
- ``lora_prompt``: AUTOMATIC1111's ``<lora:NAME:STRENGTH>`` prompt syntax read out of a prompt, and changed in it;
- ``png``: the record of an image, written into its PNG (AUTOMATIC1111's ``parameters`` and JSON) and read back;
- ``samplers``: the samplers by name; ``device``: where a pipeline runs and in what precision;
- ``grid``: prompts x seeds grids; ``prompts``: prompt tables (DrawBench, PartiPrompts, your own CSV/TSV).
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "buckets": "aspect_bucket assign bucket_name bucket_set check_bucket_count cover cover_scale DEFAULT_MAX_ASPECT default_step nearest_bucket",
    "defaults": "DEFAULT_GUIDANCE DEFAULT_REFINER_SWITCH DEFAULT_SAMPLER DEFAULT_SIZE DEFAULT_STEPS DEFAULT_WEIGHTS MAX_ASPECT MAX_GUIDANCE MAX_SEED MAX_SIZE MAX_STEPS MIN_SIZE RECOMMENDED_FILE RECOMMENDED_KEYS SIZE_STEP WEIGHT_CHOICES aspect_problem check_drawable check_recommended drawable_sides drawn_native_side parse_aspect parse_recommended parse_size recommended_line side_problem starting_settings weights_to_use",
    "device": "pick_device pipeline_dtype",
    "grid": "DEMO_PROMPTS GridRow grid_image write_grid write_rows",
    "images": "Refiner Settings StepHook Stopped check_modes check_refiner clip_skip_option generate_images guidance_kind_of native_size sampler_of",
    "lora_prompt": "MAX_STRENGTH LoraTag lora_tag lora_tags with_lora",
    "modes": "MAX_CLIP_SKIP DEFAULT_HIRES_SCALE DEFAULT_HIRES_STRENGTH DEFAULT_HIRES_UPSCALER DEFAULT_MASK_BLUR DEFAULT_STRENGTH HIRES_UPSCALERS MAX_HIRES_SCALE MAX_INIT_PIXELS MAX_MASK_BLUR MODES HiresFix InitImage check_strength read_image CONTROL_MODULES DEFAULT_CANNY MAX_CONTROL_WEIGHT Control",
    "png": "SUFFIX_FORMATS ImageRecord as_one_line exif_parameters image_format modes_of named_values parameters_from_exif parse_parameters refiner_of control_of save_image save_png settings_line with_metadata",
    "prompt_weights": "MAX_PROMPT_CHUNKS MAX_PROMPT_NESTING MAX_PROMPT_WEIGHT check_prompt_weights is_weighted plain_prompt to_compel weighted_parts",
    "prompts": "PROMPT_SETS Prompt PromptRow prompt_set_path read_prompt_table read_sample_prompts",
    "samplers": "FLOW_SAMPLERS SAMPLERS check_sampler make_sampler sampler_name with_sampler_key",
})
