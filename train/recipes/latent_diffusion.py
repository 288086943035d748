"""The model every recipe trains: latent diffusion around a trainable denoiser, a frozen VAE and frozen text towers.

- ``LatentDiffusion``: a UNet trained on the diffusion schedule (Ho et al. 2020; v-prediction from Salimans & Ho
  2022; min-SNR-gamma weighting from Hang et al. 2023): x0 = VAE latents * scaling_factor, t ~ U{0..999},
  x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps, and the UNet predicts eps or v = sqrt(a_t) eps - sqrt(1 - a_t) x0.
- ``RectifiedFlowTransformer``: an MMDiT (diffusers' ``SD3Transformer2DModel``) trained with rectified flow
  (``models.families.RectifiedFlow``): x0 = (latents - shift) * scale, x_t = (1 - t) x0 + t eps with t drawn
  logit-normal or uniform and shifted, and the transformer predicts the velocity eps - x0, conditioned as SD3's
  pipeline conditions it (CLIP penultimate states and pooled outputs). Flux.1's transformer (``flux``) is one.

SDXL's micro-conditioned UNet (``sdxl``) is a ``LatentDiffusion`` too. Every model's ``encode_text`` returns a
``TextConditioning``: the per-token states the denoiser attends to, and the pooled output where the family conditions
on one; SDXL's ``latents_and_text`` adds each image's time ids to it.

A model whose second text tower has its own tokenizer (``take_second_tokenizer``: SDXL's ``tokenizer_2``, Flux.1's T5
tokenizer) reads batches with ``input_ids_2`` beside ``input_ids``; caption dropout and the other phrasing draw one
mask per sample and apply it to both.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from composer.models import ComposerModel

from models.checkpoints import ddpm_scheduler
from models.families import TRAIN_TIMESTEPS


class Draws:
    """A batch's random draws (posterior noise, phrasing, caption dropout, timesteps, noise): from the rank's
    global generator (no ``seed``: Composer seeds rank r with seed + r, so a sample's draws depend on which rank
    and microbatch it lands in), or per sample from a counter-based generator (``philox``) keyed by the run's seed,
    the epoch and the sample's index in the dataset: the same draws whatever the number of ranks, nodes or
    microbatches, which an elastic resume (4 ranks to 2) needs to end where an uninterrupted run does.

    Per-sample draws are computed where the batch is, from its ``epoch`` and ``sample_id`` tensors: nothing is read
    back to the host. One generator per sample on the CPU took 12 ms of the host a microbatch at SDXL-1024 (2 threads,
    bench/step_syncs.py), its ids read with ``tolist()`` and its noise copied to the GPU, each a wait for the GPU's
    queue; on a CPU device Philox costs more (73 ms there). Each call of a method draws from the next stream of every
    sample (the model makes the same calls in the same order on every rank), so no two calls share numbers."""

    def __init__(self, seed: int | None = None, epoch: torch.Tensor | None = None,
                 index: torch.Tensor | None = None):
        self.seed, self.epoch, self.index = seed, epoch, index
        self.streams = 0

    @classmethod
    def of_batch(cls, batch: dict, seed: int | None) -> "Draws":
        if seed is None or "sample_id" not in batch:
            return cls()
        return cls(seed, batch["epoch"], batch["sample_id"])

    @property
    def per_sample(self) -> bool:
        return self.seed is not None

    def words(self, quads: int, device) -> torch.Tensor:
        """(B, 4 x quads) 32-bit words of the next stream of each sample."""
        from .philox import sample_words

        self.streams += 1
        return sample_words(self.seed, self.epoch.to(device), self.index.to(device), self.streams, quads)

    def uniform(self, n: int, device) -> torch.Tensor:
        if not self.per_sample:
            return torch.rand(n, device=device)
        from .philox import uniforms

        return uniforms(self.words(1, device)[:, 0])

    def normal(self, shape, device, dtype) -> torch.Tensor:
        if not self.per_sample:
            return torch.randn(shape, device=device, dtype=dtype)
        from .philox import normals_of

        count = math.prod(shape[1:])
        return normals_of(self.words(-(-count // 4), device), count).view(shape).to(dtype)

    def timesteps(self, high: int, n: int, device) -> torch.Tensor:
        if not self.per_sample:
            return torch.randint(0, high, (n,), device=device)
        return self.words(1, device)[:, 0] % high  # 32 random bits: a bias of high / 2^32 at most


@dataclass(frozen=True)
class TextConditioning:
    """What the captions condition the denoiser on: what the family's diffusers pipeline hands its denoiser from
    ``encode_prompt`` (``prompt_embeds``, ``pooled_prompt_embeds``), plus SDXL's per-image size conditioning.

    - ``states``: (B, L, D) per-token hidden states the denoiser attends to (``encoder_hidden_states``). SD 1/2: the
      text tower's last hidden states (SD2's tower already ends at its penultimate layer); SDXL: both towers'
      penultimate states side by side (D1 + D2); SD3-style MMDiT: the tower's penultimate states once per CLIP slot;
      Flux.1: the second tower's (T5's) states over its ``text_tokens`` tokens, the only states its transformer
      attends to (the CLIP tower gives only the pooled output).
    - ``pooled``: (B, P) the pooled, projected output, or None (SD 1/2 condition on none). SDXL: the second tower's
      ``text_embeds`` (the UNet's ``added_cond_kwargs["text_embeds"]``); SD3-style: the tower's ``text_embeds`` once
      per CLIP slot; Flux.1: CLIP's ``pooler_output`` (both the transformer's ``pooled_projections``).
    - ``time_ids``: (B, 6) SDXL's micro-conditioning of each image (original size, crop, target size: the UNet's
      ``added_cond_kwargs["time_ids"]``), set by ``MicroConditionedUNet.latents_and_text`` from an image batch, never
      by ``encode_text``; None: conditioned as a sample is drawn at the latents' size (held-out batches)."""

    states: torch.Tensor
    pooled: torch.Tensor | None = None
    time_ids: torch.Tensor | None = None


def stored_text(batch: dict, suffix: str = ""):
    """A precomputed batch's text states (``text`` + ``suffix``), as float32, or (states, pooled output) where it
    stores one; None where it holds no such column (``_alt``: other phrasings not asked for)."""
    if "text" + suffix not in batch:
        return None
    states = batch["text" + suffix].float()
    pooled = batch.get("pooled" + suffix)
    return states if pooled is None else (states, pooled.float())


def where_each(mask: torch.Tensor, chosen, kept):
    """Per sample (``mask``: (B,) bool), ``chosen`` where the mask is set and ``kept`` elsewhere; each a tensor or a
    tuple of tensors (one per text tower), every tensor of the tuple under the one mask."""
    if isinstance(kept, tuple):
        return tuple(where_each(mask, c, k) for c, k in zip(chosen, kept))
    return torch.where(mask.view(-1, *([1] * (kept.dim() - 1))), chosen.to(kept.device, kept.dtype), kept)


def latent_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(B, 1, H, W) pixel weights (uint8 0-255, or float 0-1) -> (B, 1, h, w) float weights on the latent grid: each
    latent cell weighs the mean weight of the pixels it stands for (area downsampling)."""
    weights = mask.float() / 255 if mask.dtype == torch.uint8 else mask.float()
    return F.interpolate(weights, size=tuple(size), mode="area")


def masked_mean_squared_error(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None):
    """Each sample's mean squared error over its (B, C, h, w) latents; with ``mask`` (pixel weights, ``latent_mask``)
    the mean weighed by the mask: sum(w e^2) / (C sum(w)), so a subject masked to a quarter of the frame trains at
    the rate of a whole image (kohya's sd-scripts multiplies by the mask and keeps the plain mean, which slows it
    4x), and a sample masked out entirely counts 0."""
    error = F.mse_loss(pred.float(), target.float(), reduction="none")
    if mask is None:
        return error.mean(dim=(1, 2, 3))
    weights = latent_mask(mask.to(error.device), error.shape[-2:])
    return (error * weights).sum(dim=(1, 2, 3)) / (weights.sum(dim=(1, 2, 3)) * error.shape[1]).clamp(min=1e-12)


def frozen_text(encode):
    """An ``encode_text`` run without gradients, unless its model trains adapters on its text towers
    (``trains_text``: ``adapter.text_encoders``) and gradients are on (a training step, not validation or a preview)."""
    @functools.wraps(encode)
    def run(self, *args, **kwargs):
        with torch.set_grad_enabled(self.trains_text and torch.is_grad_enabled()):
            return encode(self, *args, **kwargs)

    return run


class LatentDiffusion(ComposerModel):
    reads_captions = False  # precomputed data: its stored text states condition the UNet
    trains_text = False  # adapters on the text towers train with the denoiser (their captions encoded with gradients)
    # The trained part's attribute: its parameters' names in state dicts and checkpoints (``unet.*``, ``transformer.*``)
    denoiser_name = "unet"
    family = "sd2"  # the ``models.families`` entry that assembles its pipeline
    # The second text tower's own tokenizer and the tokens it pads a caption to (``take_second_tokenizer``); None:
    # the second tower, where there is one, reads the first tokenizer's ids
    tokenizer_2 = None
    max_length_2: int | None = None

    def __init__(self, unet, vae, text_encoder, tokenizer, *, prediction_type: str = "epsilon",
                 caption_dropout: float = 0.1, min_snr_gamma: float | None = None, other_phrasing: float = 0.0,
                 per_sample_seed: int | None = None):
        super().__init__()
        # Registered first, then the frozen parts: the order of the model's parameters (the optimizer's, FSDP's)
        self.add_module(self.denoiser_name, unet)
        self.take_parts(vae, text_encoder, tokenizer, caption_dropout, other_phrasing, per_sample_seed)
        self.prediction_type = prediction_type
        self.min_snr_gamma = min_snr_gamma
        self.take_schedule()

    def take_schedule(self) -> None:
        """The DDPM noise schedule the UNet trains on, its cumulative alphas a buffer (moved with the model, not
        saved)."""
        self.noise_scheduler = ddpm_scheduler(self.prediction_type)
        self.register_buffer("alphas_cumprod", self.noise_scheduler.alphas_cumprod.clone(), persistent=False)

    def take_parts(self, vae, text_encoder, tokenizer, caption_dropout: float, other_phrasing: float,
                   per_sample_seed: int | None) -> None:
        """The frozen parts and what every denoiser's training shares: caption dropout, other phrasings, draws."""
        self.per_sample_seed = per_sample_seed  # set: each sample's draws from its own generator (``Draws``)
        self.vae, self.text_encoder = vae, text_encoder
        self.tokenizer = tokenizer
        self.vae.requires_grad_(False)
        self.text_encoder.requires_grad_(False)
        # Under FSDP only the denoiser is sharded: the frozen parts are called by their methods (``vae.encode``),
        # which an FSDP wrapper's flat parameters cannot serve, and hold no gradients or optimizer state to share
        self.vae._fsdp_wrap = self.text_encoder._fsdp_wrap = False
        self.caption_dropout = caption_dropout
        self.other_phrasing = other_phrasing
        if tokenizer is not None:  # dropped captions become the empty caption (classifier-free guidance)
            from ..data import token_ids

            self.register_buffer("empty_ids", token_ids(tokenizer, [""]), persistent=False)

    def fsdp_wrap_fn(self, module: torch.nn.Module) -> bool:
        """Composer's FSDP wrapping inside the UNet: each down, mid and up block is its own unit, so a rank
        holds one block's full weights at a time (the UNet itself is the outer unit)."""
        unet = self.unet
        return any(module is block for block in (*unet.down_blocks, unet.mid_block, *unet.up_blocks))

    def take_second_tower(self, text_encoder_2) -> None:
        """A second frozen text tower (SDXL's, Flux.1's T5), kept and called whole as the first."""
        self.text_encoder_2 = text_encoder_2.requires_grad_(False)
        self.text_encoder_2._fsdp_wrap = False

    def take_second_tokenizer(self, tokenizer_2, max_length: int | None = None) -> None:
        """The second tower's own tokenizer (SDXL's ``tokenizer_2``, which pads with "!", Flux.1's T5 tokenizer), its
        captions padded to ``max_length`` tokens (its ``model_max_length`` unless given); a dropped caption becomes
        its own empty caption. None: the second tower reads the first tokenizer's ids."""
        from ..data import token_ids

        if tokenizer_2 is None:
            return
        self.tokenizer_2 = tokenizer_2
        self.max_length_2 = max_length or tokenizer_2.model_max_length
        self.register_buffer("empty_ids_2", token_ids(tokenizer_2, [""], self.max_length_2), persistent=False)

    @property
    def pipeline_tokenizer_2(self):
        """The second tokenizer as a pipeline drawing with this model holds it (Flux.1's says its T5's tokens)."""
        return self.second_tokenizer

    def spec_tokenizers(self) -> dict:
        """The tokenizers beside the first that a checkpoint's spec records (``models.checkpoints.make_spec``), by
        the pipeline's names: the second tower's own, where it has one."""
        return {"tokenizer_2": self.tokenizer_2}

    @property
    def second_tokenizer(self):
        """What tokenizes the second tower's captions: its own tokenizer, else the first."""
        return self.tokenizer if self.tokenizer_2 is None else self.tokenizer_2

    def id_keys(self) -> tuple[str, ...]:
        """The batch keys of the token ids the text towers read: ``input_ids``, and ``input_ids_2`` where the second
        tower reads its own tokenizer's (the other phrasings' under the same keys + ``_alt``)."""
        return ("input_ids",) if self.tokenizer_2 is None else ("input_ids", "input_ids_2")

    def caption_ids(self, captions: list[str]) -> dict[str, torch.Tensor]:
        """The token ids of ``captions`` under ``id_keys``, as the loader's batches carry them."""
        from ..data import token_ids

        ids = {"input_ids": token_ids(self.tokenizer, captions)}
        if self.tokenizer_2 is not None:
            ids["input_ids_2"] = token_ids(self.tokenizer_2, captions, self.max_length_2)
        return ids

    def batch_ids(self, batch: dict, suffix: str = "") -> tuple[torch.Tensor, ...] | None:
        """The batch's token ids, one tensor per ``id_keys`` entry (``suffix`` "_alt": the other phrasings'; None where
        the batch carries none)."""
        keys = [key + suffix for key in self.id_keys()]
        if suffix and not all(key in batch for key in keys):
            return None
        return tuple(batch[key] for key in keys)

    @torch.no_grad()
    def encode_captions(self, captions: list[str], device=None) -> TextConditioning:
        """The text conditioning of ``captions`` (``encode_text`` of their ids, on ``device``)."""
        return self.encode_text(*(ids.to(device) for ids in self.caption_ids(captions).values()))

    def train(self, mode: bool = True):
        super().train(mode)
        for frozen in (self.vae, self.text_encoder, getattr(self, "text_encoder_2", None)):
            if frozen is not None:  # frozen parts never switch to training behaviour
                frozen.eval()
        return self

    @property
    def denoiser(self) -> torch.nn.Module:
        """The trained part (what the optimizer, EMA, FSDP and previews act on)."""
        return getattr(self, self.denoiser_name)

    def pipeline_with(self, denoiser):
        """A diffusers pipeline drawing with ``denoiser`` (this model's, or a full copy of it) and the frozen parts,
        as the model's family assembles one (``family``)."""
        from models.checkpoints import assemble_pipeline
        from models.families import family_named

        parts = {self.denoiser_name: denoiser, "vae": self.vae, "text_encoder": self.text_encoder,
                 "text_encoder_2": getattr(self, "text_encoder_2", None)}
        tokenizers = {"tokenizer": self.tokenizer, "tokenizer_2": self.pipeline_tokenizer_2}
        return assemble_pipeline(family_named(self.family), parts, tokenizers, self.trained_settings())

    def trained_settings(self) -> dict:
        """What the pipeline's sampler takes from training: the UNet's prediction type."""
        return {"prediction_type": self.prediction_type}

    @property
    def scaling_factor(self) -> float:
        return float(self.vae.config.scaling_factor)

    @property
    def shift_factor(self) -> float:
        """Subtracted from the VAE's latents before scaling (SD3's and Flux.1's VAEs; 0 for SD's)."""
        return float(getattr(self.vae.config, "shift_factor", None) or 0.0)

    def scaled(self, latents: torch.Tensor) -> torch.Tensor:
        return (latents - self.shift_factor) * self.scaling_factor

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor, draws: Draws | None = None) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1], or uint8 pixels as the loader ships them (mapped to [-1, 1] here, on the
        device) -> (B, C, H/f, W/f) scaled latents, sampled from the posterior."""
        if images.dtype == torch.uint8:
            from ..data import model_range

            images = model_range(images)
        posterior = self.vae.encode(images).latent_dist
        if draws is None or not draws.per_sample:
            return self.scaled(posterior.sample())
        eps = draws.normal(posterior.mean.shape, posterior.mean.device, posterior.mean.dtype)
        return self.scaled(posterior.mean + posterior.std * eps)

    @frozen_text
    def encode_text(self, input_ids: torch.Tensor) -> TextConditioning:
        """(B, L) token ids -> the (B, L, D) last hidden states as ``states`` (SD2's text tower already ends at the
        penultimate layer), no pooled output, as ``StableDiffusionPipeline.encode_prompt`` builds them."""
        return TextConditioning(self.text_encoder(input_ids)[0])

    def set_empty_text(self, hidden_states: torch.Tensor, pooled: torch.Tensor | None = None) -> None:
        """The empty caption's hidden states (L, D), and its pooled output (P,) where the family conditions on one:
        what a dropped caption becomes with precomputed text."""
        self.register_buffer("empty_text", hidden_states.detach().float().clone(), persistent=False)
        if pooled is not None:
            self.register_buffer("empty_pooled", pooled.detach().float().clone(), persistent=False)

    def drop_text(self, text, draws: Draws = Draws()):
        """Caption dropout on precomputed text, drawn at every step (same draws as ``drop_captions``): ``text`` the
        hidden states, or (states, pooled output), both emptied under one draw per sample."""
        if not self.training or self.caption_dropout <= 0:
            return text
        if not hasattr(self, "empty_text"):
            raise RuntimeError("caption dropout on precomputed text needs the empty caption's states (set_empty_text)")
        first = text[0] if isinstance(text, tuple) else text
        drop = draws.uniform(first.shape[0], first.device) < self.caption_dropout
        return where_each(drop, (self.empty_text, self.empty_pooled) if isinstance(text, tuple) else self.empty_text,
                          text)

    def drop_captions(self, input_ids, draws: Draws = Draws()):
        """Each sample's caption emptied with probability ``caption_dropout``: ``input_ids`` a tensor, or a tuple of
        one per ``id_keys`` entry, each then the empty caption of its own tokenizer under one draw per sample."""
        if not self.training or self.caption_dropout <= 0:
            return input_ids
        first = input_ids[0] if isinstance(input_ids, tuple) else input_ids
        drop = draws.uniform(first.shape[0], first.device) < self.caption_dropout
        empty = (self.empty_ids, getattr(self, "empty_ids_2", None))[:len(input_ids)] \
            if isinstance(input_ids, tuple) else self.empty_ids
        return where_each(drop, empty, input_ids)

    def rephrase(self, main, alt, draws: Draws = Draws()):
        """Each sample under its other phrasing with probability ``other_phrasing`` (drawn every step, on both
        the token-id and the precomputed path, before caption dropout); ``main`` and ``alt`` tensors, or tuples of
        one per text tower, all swapped under one draw per sample."""
        if not self.training or self.other_phrasing <= 0 or alt is None:
            return main
        first = main[0] if isinstance(main, tuple) else main
        swap = draws.uniform(first.shape[0], first.device) < self.other_phrasing
        return where_each(swap, alt, main)

    def latents_and_text(self, batch: dict, draws: Draws = Draws()) -> tuple[torch.Tensor, TextConditioning]:
        """Scaled latents and the text conditioning, from raw images and token ids or from precomputed ones (the
        stored text states, the conditioning's ``states``).

        With precomputed data the posterior is sampled here as ``mean + std * eps`` (the VAE's own
        sampling: the same draws from the same generator state), so both paths see the same
        distribution and, for the same batch and RNG state, the same values.
        """
        if "latent_mean" in batch:
            return self.stored_latents_and_text(batch, draws)
        latents = self.encode_images(batch["image"], draws)
        ids = self.rephrase(self.batch_ids(batch), self.batch_ids(batch, "_alt"), draws)
        return latents, self.encode_text(*self.drop_captions(ids, draws))

    def stored_latents_and_text(self, batch: dict, draws: Draws) -> tuple[torch.Tensor, TextConditioning]:
        """Latents sampled from the stored posterior (``dwb data precompute`` scaled it but did not shift it: SD3's and
        Flux.1's VAEs shift), and the stored text states and pooled output, or, where the batch carries the stored
        captions' ids instead (``reads_captions``), the conditioning of those."""
        mean = batch["latent_mean"].float()
        latents = mean + batch["latent_std"].float() * draws.normal(mean.shape, mean.device, mean.dtype)
        latents = latents - self.shift_factor * self.scaling_factor
        if "text" not in batch:
            ids = self.rephrase(self.batch_ids(batch), self.batch_ids(batch, "_alt"), draws)
            return latents, self.encode_text(*self.drop_captions(ids, draws))
        text = self.drop_text(self.rephrase(stored_text(batch), stored_text(batch, "_alt"), draws), draws)
        states, pooled = text if isinstance(text, tuple) else (text, None)
        return latents, TextConditioning(states, pooled)

    def frozen_components(self) -> dict[str, torch.nn.Module]:
        """The frozen parts by component name: ``vae``, ``text_encoder`` and ``text_encoder_2`` where there is one."""
        parts = {"vae": self.vae, "text_encoder": self.text_encoder,
                 "text_encoder_2": getattr(self, "text_encoder_2", None)}
        return {name: part for name, part in parts.items() if part is not None}

    def hold_frozen_in(self, dtype: torch.dtype) -> "LatentDiffusion":
        """The frozen parts held in ``dtype`` (``models.checkpoints.hold_in``: a GPU run's autocast precision); self."""
        from models.checkpoints import hold_in

        for part in self.frozen_components().values():
            hold_in(part, dtype)
            for p in part.parameters():  # a text tower's adapter trains in float32, as the denoiser's does
                if p.requires_grad and p.dtype != torch.float32:
                    p.data = p.data.float()
        return self

    def forward(self, batch: dict):
        draws = Draws.of_batch(batch, self.per_sample_seed)
        latents, text = self.latents_and_text(batch, draws)
        # Drawn in logical order whatever the latents' memory layout (the VAE may return channels-last
        # latents, and randn_like follows the layout), so stored and on-the-fly latents get the same noise.
        noise = draws.normal(latents.shape, latents.device, latents.dtype)
        return self.denoise(latents, text, noise, self.draw_timesteps(draws, latents.shape[0], latents.device))

    def draw_timesteps(self, draws: Draws, n: int, device) -> torch.Tensor:
        return draws.timesteps(len(self.alphas_cumprod), n, device)

    def denoise(self, latents: torch.Tensor, text: TextConditioning, noise: torch.Tensor, t: torch.Tensor):
        """(prediction, target, t): the UNet's output on the latents noised to timesteps ``t``."""
        a = self.alphas_cumprod.to(latents.device)[t].view(-1, 1, 1, 1)
        noisy = a.sqrt() * latents + (1 - a).sqrt() * noise
        target = noise if self.prediction_type == "epsilon" else a.sqrt() * noise - (1 - a).sqrt() * latents
        return self.predict(noisy, t, text), target, t

    def predict(self, noisy: torch.Tensor, t: torch.Tensor, text: TextConditioning) -> torch.Tensor:
        """The UNet's output on noised latents at timesteps ``t``, conditioned on ``text``."""
        return self.unet(noisy, t, encoder_hidden_states=text.states).sample

    def per_sample_loss(self, outputs, weighted: bool = True, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The training objective of each sample: MSE (over ``mask``, ``masked_mean_squared_error``), weighted by
        min-SNR-gamma where configured (``weighted``; validation reports the plain MSE)."""
        pred, target, t = outputs
        per_sample = masked_mean_squared_error(pred, target, mask)
        if weighted and self.min_snr_gamma is not None:
            snr = self.alphas_cumprod.to(t.device)[t] / (1 - self.alphas_cumprod.to(t.device)[t])
            clipped = snr.clamp(max=self.min_snr_gamma)
            per_sample = per_sample * (clipped / snr if self.prediction_type == "epsilon" else clipped / (snr + 1))
        return per_sample

    def loss(self, outputs, batch):
        """The batch's mean of each sample's loss, over its mask and times its weight where the batch carries them
        (a DreamBooth dataset's ``mask`` and ``loss_weight``: ``train.data.loader.loss_terms``)."""
        per_sample = self.per_sample_loss(outputs, mask=batch.get("mask"))
        weight = batch.get("loss_weight")
        return (per_sample if weight is None else per_sample * weight.to(per_sample.device, per_sample.dtype)).mean()

    def eval_forward(self, batch, outputs=None):
        return outputs if outputs is not None else self.forward(batch)

    def get_metrics(self, is_train: bool = False) -> dict:
        return {}


class RectifiedFlowTransformer(LatentDiffusion):
    """An MMDiT trained with rectified flow, conditioned as SD3's pipeline conditions it: the text encoder's
    penultimate states and its pooled, projected output, once per CLIP slot of the family (this model's one tower
    fills each), and no T5 tokens (its pipeline is called with ``max_sequence_length=0``). Timesteps are diffusers'
    ``1000 t`` for t in [0, 1]: integers at validation's fixed timesteps, any real number in training."""

    denoiser_name = "transformer"
    family = "sd3"

    def __init__(self, transformer, vae, text_encoder, tokenizer, *, flow, clip_slots: int = 2,
                 caption_dropout: float = 0.1, other_phrasing: float = 0.0, per_sample_seed: int | None = None):
        super().__init__(transformer, vae, text_encoder, tokenizer, prediction_type="flow",
                         caption_dropout=caption_dropout, min_snr_gamma=None, other_phrasing=other_phrasing,
                         per_sample_seed=per_sample_seed)
        self.flow = flow
        self.clip_slots = clip_slots

    def take_schedule(self) -> None:
        """No DDPM schedule: the rectified flow (``flow``) draws the timesteps and noises the latents."""

    def trained_settings(self) -> dict:
        """What the pipeline's sampler takes from training: the flow's shift."""
        return {"shift": self.flow.shift}

    def fsdp_wrap_fn(self, module: torch.nn.Module) -> bool:
        """Each joint transformer block is its own FSDP unit (the transformer itself is the outer one)."""
        return any(module is block for block in self.transformer.transformer_blocks)

    @frozen_text
    def encode_text(self, input_ids: torch.Tensor) -> TextConditioning:
        """(B, L) token ids -> the penultimate states (B, L, slots x D) and pooled outputs (B, slots x P), as
        ``StableDiffusion3Pipeline.encode_prompt`` builds them from the same tower in each CLIP slot."""
        out = self.text_encoder(input_ids, output_hidden_states=True)
        states, pooled = out.hidden_states[-2], out.text_embeds
        return TextConditioning(torch.cat([states] * self.clip_slots, dim=-1),
                                torch.cat([pooled] * self.clip_slots, dim=-1))

    # precomputed latents come with their captions' ids: its tower with a projection added at build time is not the
    # tower `dwb data precompute --pretrained` encodes with
    reads_captions = True

    def draw_timesteps(self, draws: Draws, n: int, device) -> torch.Tensor:
        draw = draws.uniform(n, device) if self.flow.draws_uniform else draws.normal((n,), device, torch.float32)
        return self.flow.draw_t(draw) * TRAIN_TIMESTEPS

    def denoise(self, latents: torch.Tensor, text: TextConditioning, noise: torch.Tensor, t: torch.Tensor):
        """(velocity predicted, velocity, t in [0, 1]) for the latents noised to ``t / 1000``."""
        sigma = t.float() / TRAIN_TIMESTEPS
        noisy = self.flow.noised(latents, noise, sigma)
        pred = self.transformer(hidden_states=noisy, timestep=t.float(), encoder_hidden_states=text.states,
                                pooled_projections=text.pooled).sample
        return pred, self.flow.velocity(latents, noise), sigma

    def per_sample_loss(self, outputs, weighted: bool = True, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The MSE to the velocity (over ``mask``, ``masked_mean_squared_error``), weighted by the flow's weighting at
        each sample's t (``weighted``; validation reports the plain MSE: sigma_sqrt's weight 1 / t^2 is infinite at
        t = 0)."""
        pred, target, sigma = outputs
        per_sample = masked_mean_squared_error(pred, target, mask)
        return per_sample * self.flow.weights(sigma).to(per_sample.device) if weighted else per_sample
