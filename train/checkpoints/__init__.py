"""The one door into checkpoints: find, list, name, hash, describe and open every kind a user has.

Kinds (``names.KINDS``): ``composer`` (this project's Composer files, under any name, raw or EMA weights),
``mosaicml`` (Composer files of mosaicml/diffusion's StableDiffusion, architecture inferred from the
weights), ``diffusers`` (pipeline folders, ``fp16`` variants too), ``single-file`` (the original Stable
Diffusion layout, ``.safetensors``/``.ckpt``, SD 1.x and 2.x) and ``hub`` (a Hugging Face id from the local
cache, or downloaded where allowed); Composer checkpoints may also be ``s3://`` URIs, fetched once into a
local cache. No other module parses checkpoint file names or reads a checkpoint folder's layout.

    ckpt = find_checkpoint("runs/tiny-phase2/checkpoints/ep5-ba1100-rank0.pt")
    ckpt.kind, ckpt.label, ckpt.step, content_hash(ckpt)
    pipe = load_pipeline(ckpt, ema=True, device="cpu")
"""
from .autoresume import checkpoint_problem, select_resume_checkpoint
from .composer import has_ema, model_weights, read_checkpoint
from .find import discover, find_checkpoint, label_under, list_checkpoints, resolve_roots
from .hashing import content_hash
from .names import KINDS, Checkpoint
from .open import CheckpointInfo, describe, export_pipeline, load_pipeline

__all__ = ["KINDS", "Checkpoint", "CheckpointInfo", "checkpoint_problem", "content_hash", "describe", "discover",
           "export_pipeline", "find_checkpoint", "has_ema", "label_under", "list_checkpoints", "load_pipeline",
           "model_weights", "read_checkpoint", "resolve_roots", "select_resume_checkpoint"]
