"""`dwb prepare`: build the tiny architecture's frozen parts from the training data itself.

- tokenizer: a CLIP-format BPE vocabulary fitted on the dataset's captions (whole words become
  single tokens), saved as a plain ``CLIPTokenizer`` so exported pipelines load anywhere;
- text encoder: a frozen, randomly initialised tiny CLIP text tower (unit-std embeddings);
- VAE: a tiny ``AutoencoderKL`` trained briefly on the images (MSE + small KL), whose latents are
  then normalised per channel by folding the affine map into ``quant_conv``/``post_quant_conv``:
  the latents have zero mean and unit variance per channel with ``scaling_factor`` 1, and a plain
  StableDiffusionPipeline decodes them unchanged.
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from models.errors import WorkbenchError

from models.datasets import count_samples

SPECIAL = ["<|startoftext|>", "<|endoftext|>"]


def fit_tokenizer(captions: list[str], max_length: int = 32):
    """A CLIPTokenizer whose BPE vocabulary is fitted on ``captions``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>", unk_token="<|endoftext|>"))
    bpe.normalizer = normalizers.Lowercase()
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIAL, end_of_word_suffix="</w>", show_progress=False)
    bpe.train_from_iterator(captions, trainer)
    with tempfile.TemporaryDirectory() as tmp:
        bpe.model.save(tmp)
        _canonical_ids(Path(tmp))
        tok = CLIPTokenizer(f"{tmp}/vocab.json", f"{tmp}/merges.txt", model_max_length=max_length,
                            pad_token="<|endoftext|>")
        tok.save_pretrained(f"{tmp}/saved")
        return CLIPTokenizer.from_pretrained(f"{tmp}/saved")  # detached from the temp files' lifetime


def _canonical_ids(folder: Path) -> None:
    """Renumber a saved BPE vocabulary so the same captions always give the same token ids.

    The trainer learns the same merges run after run but numbers the tokens in an order that
    changes from process to process; the ids pick each token's row of the text encoder's
    embedding table, so they decide what the model is trained on. Canonical order: the special
    tokens, the alphabet sorted, then each merge's result in merge order.
    """
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    merges = [line.split(" ") for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    merged = list(dict.fromkeys(a + b for a, b in merges))
    alphabet = sorted(set(vocab) - set(SPECIAL) - set(merged))
    order = SPECIAL + alphabet + [t for t in merged if t not in SPECIAL]
    if sorted(order) != sorted(vocab):
        raise RuntimeError("the fitted BPE vocabulary does not match its merges")
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(order)}, ensure_ascii=False),
                                       encoding="utf-8")


def read_bucket(folder: str | Path, resolution: int, limit: int):
    """Up to ``limit`` (images (N, 3, R, R) in [-1, 1], captions) from an MDS bucket, in order."""
    from ..data import image_to_tensor
    from models.datasets import open_local  # with Streaming, which imports transformers' auto classes: seconds

    n = min(limit, count_samples(folder))
    ds = open_local(folder)
    images, captions = torch.empty(n, 3, resolution, resolution), []
    for i in tqdm(range(n), desc="read images", unit="img", leave=False):
        sample = ds.get_item(i)
        images[i] = image_to_tensor(sample["image"], resolution)
        captions.append(sample["caption"])
    return images, captions


def foreground_mask(x: torch.Tensor, threshold: float = 0.05) -> torch.Tensor:
    """(B, 1, H, W): 1 where a pixel differs from its image's median colour (the flat background of the
    shapes data), grown by one pixel so that edges count as foreground too."""
    median = x.flatten(2).median(dim=2).values[:, :, None, None]
    mask = ((x - median).abs().amax(dim=1, keepdim=True) > threshold).float()
    return F.max_pool2d(mask, 3, stride=1, padding=1)


def train_vae(vae, images: torch.Tensor, steps: int, batch_size: int = 8, lr: float = 1e-3,
              kl_weight: float = 1e-5, foreground_weight: float = 5.0, seed: int = 0,
              progress: bool = True) -> list[float]:
    """Reconstruction training: weighted MSE + kl_weight * KL(q(z|x) || N(0, I)), cosine-decayed lr.

    Pixels off the background weigh ``1 + foreground_weight``: the shapes cover a small part of each
    image, and plain MSE spends the VAE's capacity on flat background. Measured on the demo's data
    (the shapes scorer on reconstructions of 1,000 held-out images, 1,000 steps): shape read right
    0.71 with plain MSE, 0.79 with weight 5 or 10; weight 30 lost counts (0.64) and L1 lost colour.
    Small batches win on a CPU budget: at equal wall time, batch 8 x 1600 steps reached 23.3 dB
    foreground PSNR where batch 32 x 400 steps reached 13.8 dB (lr 1e-3 vs 2e-3: 17.6 vs 13.8).
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))))
    vae.train()
    losses = []
    for _ in tqdm(range(steps), desc="train tiny VAE", unit="step", disable=not progress):
        x = images[torch.randint(len(images), (batch_size,), generator=gen)]
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        recon = vae.decode(z).sample
        err = (recon - x) ** 2
        if foreground_weight:
            err = err * (1 + foreground_weight * foreground_mask(x))
        loss = err.mean() + kl_weight * posterior.kl().mean() / x[0].numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    vae.eval()
    return losses


@torch.no_grad()
def fold_latent_normalization(vae, images: torch.Tensor, batch_size: int = 256) -> tuple[list[float], list[float]]:
    """Make the posterior mean zero-mean, unit-variance per channel by rewriting the 1x1 quant convs.

    With m, s the per-channel mean and std of the old latents z: z' = (z - m) / s. ``quant_conv``
    emits (mean, logvar): mean' = (mean - m) / s, logvar' = logvar - 2 log s. ``post_quant_conv``
    takes z = s z' + m, so its weights scale by s along the input and its bias absorbs W m.
    """
    means = torch.cat([vae.encode(images[i:i + batch_size]).latent_dist.mean for i in range(0, len(images), batch_size)])
    m = means.mean(dim=(0, 2, 3))
    s = means.std(dim=(0, 2, 3)).clamp_min(1e-6)
    c = m.numel()
    qc, pqc = vae.quant_conv, vae.post_quant_conv
    qc.weight[:c] /= s.view(-1, 1, 1, 1)
    qc.bias[:c] = (qc.bias[:c] - m) / s
    qc.bias[c:] -= 2 * torch.log(s)
    pqc.bias += (pqc.weight[:, :, 0, 0] @ m)
    pqc.weight *= s.view(1, -1, 1, 1)
    vae.register_to_config(scaling_factor=1.0)
    return m.tolist(), s.tolist()


def prepare_tiny(data: str | Path, out: str | Path, *, vae_steps: int = 1200, max_images: int = 10000,
                 seed: int = 0, progress: bool = True) -> dict:
    """Write ``out/{vae,text_encoder,tokenizer}`` and ``out/prepare.json``; returns the report."""
    from models.checkpoints import TINY, random_text_encoder, random_vae  # diffusers: 10+ s of imports that fitting a tokenizer never needs

    data, out = Path(data), Path(out)
    resolution = TINY["vae"]["sample_size"]
    folder = data / str(resolution) if (data / str(resolution) / "index.json").is_file() else data
    if not (folder / "index.json").is_file():
        raise WorkbenchError(f"no MDS dataset at {data} or {data / str(resolution)} (run `dwb data shapes` first)")
    t0 = time.perf_counter()
    images, captions = read_bucket(folder, resolution, max_images)
    if len(images) == 0:
        raise WorkbenchError(f"the dataset at {folder} is empty")
    tokenizer = fit_tokenizer(captions, max_length=TINY["text_encoder"]["max_position_embeddings"])
    text_encoder = random_text_encoder("tiny", vocab_size=len(tokenizer), seed=seed)
    torch.manual_seed(seed)
    vae = random_vae("tiny")
    holdout = images[-256:] if len(images) > 512 else images
    losses = train_vae(vae, images[:-256] if len(images) > 512 else images, vae_steps, seed=seed, progress=progress)
    shift, scale = fold_latent_normalization(vae, images[: min(len(images), 4096)])
    with torch.no_grad():
        recon = vae.decode(vae.encode(holdout).latent_dist.mean).sample.clamp(-1, 1)
        mse = F.mse_loss((recon + 1) / 2, (holdout + 1) / 2).item()
    out.mkdir(parents=True, exist_ok=True)
    vae.save_pretrained(out / "vae")
    text_encoder.save_pretrained(out / "text_encoder")
    tokenizer.save_pretrained(out / "tokenizer")
    report = {
        "data": str(folder), "images": len(images), "vocab_size": len(tokenizer), "vae_steps": vae_steps,
        "vae_final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "vae_holdout_psnr_db": 10 * math.log10(1.0 / max(mse, 1e-12)),
        "latent_shift": shift, "latent_scale": scale, "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "prepare.json").write_text(json.dumps(report, indent=2))
    return report
