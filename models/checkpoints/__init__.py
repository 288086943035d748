"""The one door into checkpoints: find, list, name, hash, describe and open every kind a user has.

Kinds (``names.KINDS``): ``composer`` (this project's Composer files, under any name, raw or EMA weights),
``mosaicml`` (Composer files of mosaicml/diffusion's StableDiffusion, architecture inferred from the
weights), ``diffusers`` (pipeline folders, ``fp16`` variants too), ``single-file`` (the original Stable
Diffusion layout, ``.safetensors``/``.ckpt``, SD 1.x and 2.x) and ``hub`` (a Hugging Face id from the local
cache, or downloaded where allowed); Composer checkpoints may also be ``s3://`` URIs, fetched once into a
local cache. No other module parses checkpoint file names or reads a checkpoint folder's layout.

The room also holds what a checkpoint is made of and how it describes itself: the architectures, the
parts a model is built from (``components``), the noise schedule (``schedules``) and the spec a
checkpoint carries (``spec``).

    ckpt = find_checkpoint("runs/tiny-phase2/checkpoints/ep5-ba1100-rank0.pt")
    ckpt.kind, ckpt.label, ckpt.step, content_hash(ckpt)
    pipe = load_pipeline(ckpt, ema=True, device="cpu")
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "architectures": "ARCHITECTURES denoiser_config TINY",
    "autoresume": "checkpoint_problem resume_problem select_resume_checkpoint",
    "components": "assemble_pipeline builds_second_tower build_transformer build_unet load_frozen_parts load_part random_text_encoder random_vae second_text_encoder second_tokenizer with_max_length with_projection",
    "entries": "ENTRY_SEPARATOR Entry EntryAdapter entry_adapter entry_ref find_entry is_entry open_entry parse_entry",
    "vae": "MAX_VAE_BYTES OpenedVae a1111_vae_hash check_vae_fits find_vae open_vae",
    "controlnet": "MAX_CONTROLNET_BYTES OpenedControlNet check_takes_controlnet controlnet_hash find_controlnet open_controlnet",
    "composer": "checkpoint_cost DROPPED_SUFFIXES has_ema model_key model_weights read_checkpoint read_summary",
    "find": "check_reads_inside Checkpoint discover find_checkpoint label_under list_checkpoints raise_reason resolve_roots",
    "flux_parts": "T5_TOKENS load_t5_parts random_t5_encoder",
    "frozen": "held_bytes hold_in",
    "hashing": "content_hash fingerprint",
    "hub": "hub_cache is_hub_id",
    "lora_files": "ChosenLora LoraFile LoraFiles holds_adapter",
    "memory": "check_training_memory FSDP_STRATEGIES module_size pretrained_part_values rank_plan RankPlan",
    "names": "KINDS Checkpoint",
    "open": "absent_parts CheckpointInfo describe export_pipeline is_refiner load_pipeline native_size_of weights_of",
    "recommended": "recommended_settings write_recommended",
    "remote": "fetch",
    "schedules": "ddpm_scheduler family_scheduler inference_scheduler",
    "single_file": "RECOMMENDED_KEY SD1_TEXT SD2_TEXT SD_SCHEDULE SPEC_KEY UNET VAE write_spec_folder",
    "spec": "make_spec plain_data SPEC_FORMAT SPEC_FORMATS",
})
