"""Checkpoints of every outside kind in their real layouts, with random weights at reduced sizes.

- ``reduced_pipeline``: a StableDiffusionPipeline shaped like SD 2.x (OpenCLIP-style text tower, linear
  attention projections) or SD 1.x, small enough for CPU tests, with the real CLIP BPE tokenizer;
- ``write_hub_snapshot``: a diffusers folder placed in a Hugging Face cache as huggingface_hub writes
  it (``models--org--name/blobs/<hash>``, ``snapshots/<commit>/...`` symlinks, ``refs/<branch>``);
- ``original_layout.write_single_file``: the same weights as one original-layout file.

``write_reference_folder``, ``write_single_files`` and ``write_hub_cache`` build the whole set in a
folder; ``conftest.py`` here makes them session fixtures, and other test areas can do the same.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

PROMPT, SEED, STEPS, GUIDANCE = "two small red circles left of a blue square", 7, 3, 3.0


def reduced_pipeline(family: str = "sd2", prediction_type: str = "epsilon", seed: int = 0):
    """Random weights at reduced sizes: 32 px images, 8x8x4 latents, a 2-block UNet, a 64-wide text tower
    with the real 49,408-token CLIP vocabulary. Every weight is perturbed (seeded), so no two tensors of
    the same shape are equal and a swapped key shows in the image."""
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from models.checkpoints.clip_bpe import END, VOCAB_SIZE, write_clip_tokenizer
    from models.checkpoints import inference_scheduler

    sd2 = family == "sd2"
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=64,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=[4, 8] if sd2 else 2, use_linear_projection=sd2)
    vae = AutoencoderKL(block_out_channels=(32, 64, 64), layers_per_block=1, latent_channels=4, sample_size=32,
                        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
        max_position_embeddings=77, projection_dim=64, hidden_act="gelu" if sd2 else "quick_gelu"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in (unet, vae, text_encoder):
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = CLIPTokenizer.from_pretrained(write_clip_tokenizer(tmp, pad_token="!" if sd2 else END))
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=inference_scheduler(prediction_type), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(torch.float32)


@torch.no_grad()
def generate(pipe, prompt: str = PROMPT, seed: int = SEED):
    """One image (H, W, 3 float32 numpy) with fixed settings: what "the same image" is compared on."""
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt, num_inference_steps=STEPS, guidance_scale=GUIDANCE, output_type="np",
                generator=torch.Generator().manual_seed(seed)).images[0]


def _blob_name(path: Path) -> str:
    """The blob name huggingface_hub gives a file: the sha256 of LFS files (weights), the git blob sha1 of
    the others."""
    data = path.read_bytes()
    if path.suffix in (".safetensors", ".bin", ".ckpt"):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_hub_snapshot(cache: Path, repo: str, folder: Path, commit: str, refs: tuple[str, ...] = ()) -> Path:
    """Place ``folder`` in the hub cache ``cache`` as revision ``commit`` of ``repo`` (branches ``refs``)."""
    storage = Path(cache) / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        blob = storage / "blobs" / _blob_name(file)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(file.read_bytes())
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    for ref in refs:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)  # no newline: huggingface_hub reads the file as is
    return snapshot


def commit_hash(label: str) -> str:
    return hashlib.sha1(label.encode()).hexdigest()


HUB_REPO = "dwb-test/tiny-sd2"


@dataclass
class HubCache:
    cache: Path  # what HF_HUB_CACHE points at
    repo: str
    main: str  # commit of refs/main: the reference pipeline
    other: str  # commit of refs/v2: the same pipeline with another UNet
    main_snapshot: Path
    other_snapshot: Path


def write_reference_folder(out: Path) -> Path:
    """The reduced SD 2.x pipeline (v prediction) as a diffusers folder: what every kind is compared to."""
    reduced_pipeline("sd2", "v_prediction", seed=0).save_pretrained(out, safe_serialization=True)
    return out


def write_single_files(out: Path, reference: Path) -> dict[str, tuple[Path, Path]]:
    """``{name: (single file, the same weights as a diffusers folder)}``: sd2 as .safetensors and .ckpt
    (the reference folder's weights, v prediction) and sd1 as .safetensors (epsilon), each with its
    sidecar original config."""
    from diffusers import StableDiffusionPipeline

    from .original_layout import write_single_file

    out.mkdir(parents=True, exist_ok=True)
    sd2 = StableDiffusionPipeline.from_pretrained(reference, safety_checker=None)
    sd1 = reduced_pipeline("sd1", "epsilon", seed=1)
    sd1.save_pretrained(out / "sd1-folder", safe_serialization=True)
    return {
        "sd2": (write_single_file(sd2, out / "sd2.safetensors", "sd2", prediction_type="v_prediction"), reference),
        "sd2-ckpt": (write_single_file(sd2, out / "sd2.ckpt", "sd2", prediction_type="v_prediction"), reference),
        "sd1": (write_single_file(sd1, out / "sd1.safetensors", "sd1", prediction_type="epsilon"), out / "sd1-folder"),
    }


def write_hub_cache(out: Path, reference: Path) -> HubCache:
    """A Hugging Face cache ``out/hub`` holding HUB_REPO at two revisions: main (the reference folder) and
    branch v2 (another UNet)."""
    from diffusers import UNet2DConditionModel

    cache = out / "hub"
    main, other = commit_hash("main"), commit_hash("v2")
    main_snapshot = write_hub_snapshot(cache, HUB_REPO, reference, main, refs=("main",))
    v2 = out / "v2-pipeline"
    shutil.copytree(reference, v2)
    unet = UNet2DConditionModel.from_pretrained(reference, subfolder="unet")
    for p in unet.parameters():
        p.data.mul_(1.5)
    unet.save_pretrained(v2 / "unet")
    other_snapshot = write_hub_snapshot(cache, HUB_REPO, v2, other, refs=("v2",))
    return HubCache(cache, HUB_REPO, main, other, main_snapshot, other_snapshot)
