"""Flux.1: a transformer on rectified flow at Flux.1's resolution shift, conditioned on T5's states and CLIP's pooled
output, its latents packed 2x2 into tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from models.errors import WorkbenchError
from models.families import TRAIN_TIMESTEPS

from ..config import TrainConfig
from .denoiser import (caption_options, prepared_denoiser, run_frozen_dtype, source_denoiser, source_parts,
                       with_recorded_shift)
from .latent_diffusion import RectifiedFlowTransformer, TextConditioning, frozen_text
from .recipe import Recipe


class FluxStyleTransformer(RectifiedFlowTransformer):
    """Flux.1's transformer (diffusers' ``FluxTransformer2DModel``) trained with rectified flow, conditioned as
    ``FluxPipeline`` conditions it: T5's states over ``text_tokens`` tokens and CLIP's pooled output, the latents
    packed 2x2 into tokens with their position ids (``models.families.pack_latents``), the timestep t in [0, 1].
    The T5 reads its own tokenizer's ids (``tokenizer_2``: Flux.1's T5 tokenizer, ``text_tokens`` tokens), or, where
    the model has none (the tiny architecture: ``flux_parts``), the CLIP tokenizer's ids padded to ``text_tokens``.
    A guidance-distilled transformer (``guidance_embeds``, Flux.1-dev's) is told ``guidance_scale`` at every step, as
    FluxPipeline tells it the guidance it samples at."""

    family = "flux"
    reads_captions = False  # precomputed: the stored T5 states and CLIP pooled output (`dwb data precompute --config`)

    def __init__(self, transformer, vae, text_encoder, tokenizer, text_encoder_2, *, flow, text_tokens: int,
                 tokenizer_2=None, guidance_scale: float = 3.5, caption_dropout: float = 0.1,
                 other_phrasing: float = 0.0, per_sample_seed: int | None = None):
        super().__init__(transformer, vae, text_encoder, tokenizer, flow=flow, clip_slots=1,
                         caption_dropout=caption_dropout, other_phrasing=other_phrasing,
                         per_sample_seed=per_sample_seed)
        self.take_second_tower(text_encoder_2)
        self.take_second_tokenizer(tokenizer_2, text_tokens)
        self.text_tokens = text_tokens
        # read now: under FSDP the transformer is a wrapper whose config is its module's
        self.guidance_embeds = bool(transformer.config.guidance_embeds)
        self.guidance_scale = guidance_scale

    def fsdp_wrap_fn(self, module: torch.nn.Module) -> bool:
        """Each double-stream and single-stream block is its own FSDP unit (the transformer is the outer one)."""
        blocks = (*self.transformer.transformer_blocks, *self.transformer.single_transformer_blocks)
        return any(module is block for block in blocks)

    @frozen_text
    def encode_text(self, input_ids: torch.Tensor, input_ids_2: torch.Tensor | None = None) -> TextConditioning:
        """(B, L) CLIP token ids (and T5's own, (B, text_tokens), where the model has T5's tokenizer) -> T5's states
        (B, text_tokens, D) and CLIP's pooled output (B, P), as ``FluxPipeline.encode_prompt`` builds them (without
        T5's own ids: the CLIP ids padded to ``text_tokens``, as the pipeline pads them with the one tokenizer)."""
        pooled = self.text_encoder(input_ids, output_hidden_states=False).pooler_output
        if input_ids_2 is None:
            pad = self.text_tokens - input_ids.shape[1]
            input_ids_2 = F.pad(input_ids, (0, pad), value=self.tokenizer.pad_token_id)
        return TextConditioning(self.text_encoder_2(input_ids_2, output_hidden_states=False)[0], pooled)

    def denoise(self, latents: torch.Tensor, text: TextConditioning, noise: torch.Tensor, t: torch.Tensor):
        """(velocity predicted, velocity, t in [0, 1]) for the latents noised to ``t / 1000``, packed as tokens."""
        from models.families import latent_ids, pack_latents, text_ids, unpack_latents

        states, pooled = text.states, text.pooled
        sigma = t.float() / TRAIN_TIMESTEPS
        noisy = pack_latents(self.flow.noised(latents, noise, sigma))
        height, width = latents.shape[-2:]
        out = self.transformer(hidden_states=noisy, timestep=sigma.to(noisy.dtype), guidance=self.guidance(noisy),
                               pooled_projections=pooled, encoder_hidden_states=states,
                               txt_ids=text_ids(states.shape[1]).to(noisy), img_ids=latent_ids(height, width).to(noisy))
        return unpack_latents(out.sample, height, width), self.flow.velocity(latents, noise), sigma

    @property
    def pipeline_tokenizer_2(self):
        """The T5's tokenizer as a pipeline drawing with this model holds it: saying the ``text_tokens`` it reads."""
        from models.checkpoints import with_max_length

        return with_max_length(self.second_tokenizer, self.text_tokens)

    def guidance(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """(B,) float32 ``guidance_scale`` for a guidance-distilled transformer, as FluxPipeline builds it; None for one
        without a guidance input (Flux.1-schnell's), whose time embedding takes none."""
        if not self.guidance_embeds:
            return None
        return torch.full((tokens.shape[0],), self.guidance_scale, device=tokens.device, dtype=torch.float32)


def build_flux_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> FluxStyleTransformer:
    """A Flux.1-style transformer on rectified flow at Flux.1's resolution shift (``flux_shift``): its T5 built here
    and reading the CLIP tokenizer's ids (the tiny architecture), or pretrained with T5's own tokenizer."""
    from models.checkpoints import ARCHITECTURES, load_t5_parts, random_t5_encoder

    m = cfg.model
    if ARCHITECTURES[m.architecture].get("builds_t5_encoder"):
        if m.text_tokens < tokenizer.model_max_length:  # its T5 reads the CLIP ids, padded, never cut
            raise WorkbenchError(f"config key 'model.text_tokens' must be at least {tokenizer.model_max_length} for "
                                 f"{m.architecture}, whose T5 reads the CLIP tokenizer's ids, got {m.text_tokens}")
        text_encoder_2, tokenizer_2 = random_t5_encoder(m.architecture, len(tokenizer), tokenizer.pad_token_id), None
    elif m.pretrained is None:
        raise WorkbenchError(f"config key 'model.pretrained': {m.architecture} loads its T5 encoder and T5's tokenizer "
                             "from a FLUX.1 diffusers folder or hub id (text_encoder_2/, tokenizer_2/); set it")
    else:  # T5-XXL and its own tokenizer, pretrained
        text_encoder_2, tokenizer_2 = load_t5_parts(m.pretrained, run_frozen_dtype(cfg))
    transformer = prepared_denoiser(cfg, with_recorded_shift(vae), packed=4)
    c = transformer.config
    if c.joint_attention_dim != text_encoder_2.config.d_model or c.pooled_projection_dim != text_encoder.config.hidden_size:
        raise WorkbenchError(f"the transformer's joint_attention_dim and pooled_projection_dim must be "
                             f"{text_encoder_2.config.d_model} (T5's width) and {text_encoder.config.hidden_size} "
                             "(the CLIP tower's)")
    return FluxStyleTransformer(transformer, vae, text_encoder, tokenizer, text_encoder_2, flow=flux_flow(cfg, vae),
                                text_tokens=m.text_tokens, tokenizer_2=tokenizer_2, guidance_scale=m.guidance_scale,
                                **caption_options(cfg))


def flux_flow(cfg: TrainConfig, vae):
    """The run's rectified flow at Flux.1's shift for its images' tokens (2x2 patches of latents), as FluxPipeline
    shifts its sampling schedule at the same size."""
    from models.families import RectifiedFlow, patches_shift

    m = cfg.model
    latent_side = cfg.data.resolution // 2 ** (len(vae.config.block_out_channels) - 1)
    shift = m.flow_shift if m.flow_shift is not None else patches_shift((latent_side // 2) ** 2)
    return RectifiedFlow(logit_mean=m.logit_mean, logit_std=m.logit_std, shift=shift, weighting=m.loss_weighting,
                         sampling=m.timestep_sampling)


def flux_model_from(cfg: TrainConfig, pipe) -> FluxStyleTransformer:
    """A Flux.1 pipeline's transformer, CLIP and T5 towers and their tokenizers (T5 reading the CLIP ids where the
    pipeline's second tokenizer is its first: a tiny architecture's checkpoint), on rectified flow at Flux.1's shift."""
    if cfg.data.precomputed:
        raise WorkbenchError("config key 'data.precomputed': Flux.1 reads its T5 states from the captions, which "
                             "precomputed latents do not carry for it; train it from images")
    vae, text_encoder, text_encoder_2, tokenizer, tokenizer_2 = source_parts(
        pipe, "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2")
    vae = with_recorded_shift(vae)
    return FluxStyleTransformer(source_denoiser(cfg, pipe.transformer), vae, text_encoder, tokenizer, text_encoder_2,
                                flow=flux_flow(cfg, vae), text_tokens=cfg.model.text_tokens,
                                tokenizer_2=None if tokenizer_2 is tokenizer else tokenizer_2,
                                guidance_scale=cfg.model.guidance_scale, **caption_options(cfg))


RECIPE = Recipe(families=("flux",), model=FluxStyleTransformer, build=build_flux_model, from_pipeline=flux_model_from)
