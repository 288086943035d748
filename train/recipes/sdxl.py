"""SDXL: a UNet on the diffusion schedule conditioned on two text towers, the second's pooled output and each image's
original size, crop and target size (Podell et al. 2023, "micro-conditioning")."""
from __future__ import annotations

from dataclasses import replace

import torch

from models.errors import WorkbenchError

from ..config import TrainConfig
from .denoiser import (caption_options, prepared_denoiser, run_frozen_dtype, source_denoiser, source_parts,
                       source_prediction_type, with_source_schedule)
from .latent_diffusion import Draws, LatentDiffusion, TextConditioning, frozen_text
from .recipe import Recipe


def time_ids(original_size: torch.Tensor, crop_top_left: torch.Tensor, target_size: tuple[int, int]) -> torch.Tensor:
    """(B, 6) float: SDXL's added time ids of each image in the order ``StableDiffusionXLPipeline._get_add_time_ids``
    lays them out: original (height, width), crop (top, left), target (height, width)."""
    target = torch.tensor(target_size, device=original_size.device).expand(len(original_size), 2)
    return torch.cat([original_size, crop_top_left, target], dim=1).float()


class MicroConditionedUNet(LatentDiffusion):
    """SDXL's UNet ("text_time" added conditioning) on the diffusion schedule. Each batch of images carries
    ``original_size`` and ``crop_top_left`` (the loader's: SDXL's c_size and c_crop), the target size is the image's;
    caption dropout empties the caption for both towers. The second tower reads its own tokenizer's ids where the model
    has one (SDXL's ``tokenizer_2``, which pads with "!"), else the first's (the tiny architecture's towers share
    one). Held-out batches (validation) carry no sizes: they are conditioned as the pipeline conditions a
    sample, original size = target size, no crop."""

    family = "sdxl"

    def __init__(self, unet, vae, text_encoder, text_encoder_2, tokenizer, tokenizer_2=None, **options):
        super().__init__(unet, vae, text_encoder, tokenizer, **options)
        self.take_second_tower(text_encoder_2)
        self.take_second_tokenizer(tokenizer_2)

    @frozen_text
    def encode_text(self, input_ids: torch.Tensor, input_ids_2: torch.Tensor | None = None) -> TextConditioning:
        """(B, L) token ids (and the second tokenizer's, where the second tower has its own) -> both towers'
        penultimate states side by side (B, L, D1 + D2) and the second's pooled, projected output (B, P), as
        ``StableDiffusionXLPipeline.encode_prompt`` builds them."""
        first = self.text_encoder(input_ids, output_hidden_states=True)
        second = self.text_encoder_2(input_ids if input_ids_2 is None else input_ids_2, output_hidden_states=True)
        return TextConditioning(torch.cat([first.hidden_states[-2], second.hidden_states[-2]], dim=-1),
                                second.text_embeds)

    def latents_and_text(self, batch: dict, draws: Draws = Draws()) -> tuple[torch.Tensor, TextConditioning]:
        """Scaled latents, and the text states, pooled output and time ids of each image (an image batch's, or stored
        beside precomputed latents by `dwb data precompute`)."""
        latents, text = super().latents_and_text(batch, draws)
        if "original_size" not in batch or "crop_top_left" not in batch:
            raise RuntimeError("an image batch for SDXL's micro-conditioning carries original_size and crop_top_left")
        target = tuple(d * self.vae_scale for d in latents.shape[-2:])  # the image's size, stored latents' too
        ids = time_ids(batch["original_size"], batch["crop_top_left"], target)
        return latents, replace(text, time_ids=ids.to(text.states.dtype))

    def predict(self, noisy: torch.Tensor, t: torch.Tensor, text: TextConditioning) -> torch.Tensor:
        sizes = text.time_ids
        if sizes is None:  # held out: as a sample is drawn at this size
            side = [d * self.vae_scale for d in noisy.shape[-2:]]
            zeros = torch.zeros(len(noisy), 2, dtype=torch.long, device=noisy.device)
            sizes = time_ids(torch.tensor(side, device=noisy.device).expand(len(noisy), 2), zeros, side)
        added = {"text_embeds": text.pooled, "time_ids": sizes.to(text.states.dtype)}
        return self.unet(noisy, t, encoder_hidden_states=text.states, added_cond_kwargs=added).sample

    @property
    def vae_scale(self) -> int:
        """Pixels per latent along a side (the pipeline's ``vae_scale_factor``)."""
        return 2 ** (len(self.vae.config.block_out_channels) - 1)


def build_sdxl_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> MicroConditionedUNet:
    """SDXL's UNet with two text towers; the second reads its own tokenizer (``tokenizer_2/``) where it loads from
    ``model.pretrained``, the first tokenizer's ids where the architecture builds it."""
    from models.checkpoints import second_text_encoder, second_tokenizer

    m = cfg.model
    text_encoder_2 = second_text_encoder(m.architecture, m.pretrained, tokenizer, run_frozen_dtype(cfg))
    tokenizer_2 = second_tokenizer(m.architecture, m.pretrained)
    unet = prepared_denoiser(cfg, vae)
    width = text_encoder.config.hidden_size + text_encoder_2.config.hidden_size
    added = text_encoder_2.config.projection_dim + 6 * unet.config.addition_time_embed_dim
    if unet.config.cross_attention_dim != width or unet.config.projection_class_embeddings_input_dim != added:
        raise WorkbenchError(f"the UNet's cross_attention_dim and projection_class_embeddings_input_dim must be {width} "
                             f"(both text towers' widths) and {added} (the second's pooled output and 6 time ids)")
    return MicroConditionedUNet(unet, vae, text_encoder, text_encoder_2, tokenizer, tokenizer_2,
                                prediction_type=m.prediction_type, min_snr_gamma=m.min_snr_gamma,
                                **caption_options(cfg))


def sdxl_model_from(cfg: TrainConfig, pipe) -> MicroConditionedUNet:
    """An SDXL pipeline's UNet, both text towers and both tokenizers, on its scheduler's schedule and prediction
    type. A refiner (no first tower) is refused: it finishes a base's latents and trains as no base does."""
    if cfg.data.precomputed:
        raise WorkbenchError("config key 'data.precomputed': SDXL is conditioned on each image's original size and "
                             "crop, which precomputed latents do not store; train it from images")
    if getattr(pipe, "text_encoder", None) is None:
        raise WorkbenchError("config key 'model.init_from': an SDXL refiner (no first text tower) is not fine-tuned "
                             "here; start from a base model")
    vae, text_encoder, text_encoder_2, tokenizer, tokenizer_2 = source_parts(
        pipe, "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2")
    model = MicroConditionedUNet(source_denoiser(cfg, pipe.unet), vae, text_encoder, text_encoder_2, tokenizer,
                                 None if tokenizer_2 is tokenizer else tokenizer_2,
                                 prediction_type=source_prediction_type(pipe), min_snr_gamma=cfg.model.min_snr_gamma,
                                 **caption_options(cfg))
    return with_source_schedule(model, pipe)


RECIPE = Recipe(families=("sdxl",), model=MicroConditionedUNet, build=build_sdxl_model, from_pipeline=sdxl_model_from)
