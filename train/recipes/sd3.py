"""SD3/3.5: an MMDiT on rectified flow at SD3's resolution shift, conditioned on one CLIP tower's states and pooled
output in each of the family's CLIP slots (``RectifiedFlowTransformer``: this workbench's MMDiT architectures), or,
fine-tuned from an SD3 the user holds, on its own CLIP-L, CLIP-G and T5 (``ThreeTowerMMDiT``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from models.errors import WorkbenchError

from ..config import TrainConfig
from .denoiser import caption_options, prepared_denoiser, source_denoiser, source_parts, with_recorded_shift
from .latent_diffusion import RectifiedFlowTransformer, TextConditioning, frozen_text
from .recipe import Recipe


class ClipIds:
    """CLIP-G's token ids of captions, made from CLIP-L's: SD3's two CLIP tokenizers share one vocabulary, length
    and end-of-text token and differ at most in the token they pad with after the text (Stability's CLIP-G tokenizer
    pads with "!", as SDXL's second does), so CLIP-G's ids are CLIP-L's with every position after the first
    end-of-text token set to its own padding. Tokenizers that differ otherwise are refused in one line."""

    def __init__(self, tokenizer, tokenizer_g):
        if tokenizer_g is not tokenizer and (
                tokenizer_g.get_vocab() != tokenizer.get_vocab() or tokenizer_g.eos_token_id != tokenizer.eos_token_id
                or tokenizer_g.model_max_length != tokenizer.model_max_length):
            raise WorkbenchError("config key 'model.init_from': SD3's two CLIP tokenizers differ in vocabulary, "
                                 "end-of-text token or length; only their padding may differ here")
        self.tokenizer_g = tokenizer_g
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer_g.pad_token_id

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        ended = ids == self.eos
        after = (ended.cumsum(dim=1) - ended.long()) > 0  # past each row's first end-of-text token
        return ids.masked_fill(after, self.pad)


class ThreeTowerMMDiT(RectifiedFlowTransformer):
    """SD3's MMDiT conditioned as ``StableDiffusion3Pipeline.encode_prompt`` conditions it: CLIP-L's and CLIP-G's
    penultimate states side by side, zero-padded to T5's width, then T5's states over ``text_tokens`` tokens; both
    CLIP towers' pooled, projected outputs side by side. Batches carry CLIP-L's ids (``input_ids``; CLIP-G's are
    made from them, ``ClipIds``) and T5's own (``input_ids_2``: T5's tokenizer is the model's second tokenizer)."""

    def __init__(self, transformer, vae, text_encoder, tokenizer, text_encoder_2, text_encoder_3, clip_ids: ClipIds,
                 *, flow, text_tokens: int, tokenizer_3, caption_dropout: float = 0.1, other_phrasing: float = 0.0,
                 per_sample_seed: int | None = None):
        super().__init__(transformer, vae, text_encoder, tokenizer, flow=flow, clip_slots=2,
                         caption_dropout=caption_dropout, other_phrasing=other_phrasing,
                         per_sample_seed=per_sample_seed)
        self.take_second_tower(text_encoder_2)
        self.text_encoder_3 = text_encoder_3.requires_grad_(False)
        self.text_encoder_3._fsdp_wrap = False
        self.clip_ids = clip_ids
        self.take_second_tokenizer(tokenizer_3, text_tokens)
        self.text_tokens = text_tokens

    @frozen_text
    def encode_text(self, input_ids: torch.Tensor, input_ids_2: torch.Tensor | None = None) -> TextConditioning:
        """(B, 77) CLIP-L ids and (B, text_tokens) T5 ids -> the states (B, 77 + text_tokens, T5's width) and pooled
        outputs (B, P_L + P_G)."""
        if input_ids_2 is None:
            raise RuntimeError("SD3's T5 reads its own tokenizer's ids (input_ids_2)")
        first = self.text_encoder(input_ids, output_hidden_states=True)
        second = self.text_encoder_2(self.clip_ids(input_ids), output_hidden_states=True)
        t5 = self.text_encoder_3(input_ids_2)[0]
        clip = torch.cat([first.hidden_states[-2], second.hidden_states[-2]], dim=-1)
        clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return TextConditioning(torch.cat([clip, t5], dim=-2),
                                torch.cat([first.text_embeds, second.text_embeds], dim=-1))

    def train(self, mode: bool = True):
        super().train(mode)
        self.text_encoder_3.eval()
        return self

    def frozen_components(self) -> dict[str, torch.nn.Module]:
        return {**super().frozen_components(), "text_encoder_3": self.text_encoder_3}

    def spec_tokenizers(self) -> dict:
        """CLIP-G's tokenizer and T5's, as SD3's pipeline names them."""
        return {"tokenizer_2": self.clip_ids.tokenizer_g, "tokenizer_3": self.tokenizer_2}

    def pipeline_with(self, denoiser):
        """SD3's pipeline around ``denoiser`` and the three towers with their own tokenizers, T5's saying the
        ``text_tokens`` it reads (``Family.text_length``: previews draw with as many T5 tokens as training read)."""
        from models.checkpoints import assemble_pipeline, with_max_length
        from models.families import family_named

        parts = {self.denoiser_name: denoiser, "vae": self.vae, "text_encoder": self.text_encoder,
                 "text_encoder_2": self.text_encoder_2, "text_encoder_3": self.text_encoder_3}
        tokenizers = {"tokenizer": self.tokenizer, **self.spec_tokenizers(),
                      "tokenizer_3": with_max_length(self.tokenizer_2, self.text_tokens)}
        return assemble_pipeline(family_named(self.family), parts, tokenizers, self.trained_settings())


def flow_of(cfg: TrainConfig):
    """The run's rectified flow: the configured draws, and the shift its resolution takes (SD3's sqrt rule)."""
    from models.checkpoints import ARCHITECTURES
    from models.families import RectifiedFlow, pixels_shift

    m = cfg.model
    base = ARCHITECTURES[m.architecture]["flow_base_resolution"]
    shift = m.flow_shift if m.flow_shift is not None else pixels_shift(cfg.data.resolution ** 2, base ** 2)
    return RectifiedFlow(logit_mean=m.logit_mean, logit_std=m.logit_std, shift=shift, weighting=m.loss_weighting,
                         sampling=m.timestep_sampling)


def build_transformer_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> RectifiedFlowTransformer:
    from models.checkpoints import with_projection

    m = cfg.model
    if cfg.data.precomputed and m.other_phrasing > 0:
        raise WorkbenchError(f"config key 'model.other_phrasing': {m.architecture} on precomputed latents reads the "
                             "stored captions, not their other phrasings; set it to 0 or train from images")
    transformer = prepared_denoiser(cfg, with_recorded_shift(vae))
    slots = 2  # SD3's pipeline fills two CLIP slots; this model's one tower fills both
    width = slots * text_encoder.config.hidden_size
    if transformer.config.joint_attention_dim != width or transformer.config.pooled_projection_dim != width:
        raise WorkbenchError(f"the transformer's joint_attention_dim and pooled_projection_dim must be {width} (the "
                             f"text encoder's width {text_encoder.config.hidden_size} in {slots} CLIP slots)")
    return RectifiedFlowTransformer(transformer, vae, with_projection(text_encoder), tokenizer, flow=flow_of(cfg),
                                    clip_slots=slots, **caption_options(cfg))


def source_flow(cfg: TrainConfig, pipe):
    """The run's rectified flow at the source sampler's shift (``model.flow_shift`` over it)."""
    from models.families import RectifiedFlow

    m = cfg.model
    shift = m.flow_shift if m.flow_shift is not None else float(pipe.scheduler.config.get("shift", 1.0))
    return RectifiedFlow(logit_mean=m.logit_mean, logit_std=m.logit_std, shift=shift, weighting=m.loss_weighting,
                         sampling=m.timestep_sampling)


def transformer_model_from(cfg: TrainConfig, pipe) -> RectifiedFlowTransformer:
    """An SD3 pipeline, on rectified flow at its sampler's shift: SD3's own three towers (CLIP-L, CLIP-G, T5:
    ``ThreeTowerMMDiT``), or one CLIP tower in both CLIP slots and no T5 (a checkpoint of this workbench's MMDiT
    architectures). Two CLIP towers without the T5 are refused in one line."""
    if pipe.text_encoder_2 is not pipe.text_encoder:
        if getattr(pipe, "text_encoder_3", None) is None:
            raise WorkbenchError("config key 'model.init_from': an SD3 pipeline without its T5 tower is not trained "
                                 "here; give the model with text_encoder_3/")
        return three_tower_model_from(cfg, pipe)
    vae, text_encoder, tokenizer = source_parts(pipe, "vae", "text_encoder", "tokenizer")
    return RectifiedFlowTransformer(source_denoiser(cfg, pipe.transformer), with_recorded_shift(vae), text_encoder,
                                    tokenizer, flow=source_flow(cfg, pipe), clip_slots=2, **caption_options(cfg))


def three_tower_model_from(cfg: TrainConfig, pipe) -> "ThreeTowerMMDiT":
    """SD3's MMDiT with its CLIP-L, CLIP-G and T5 towers and their tokenizers, each tower's width checked against
    the transformer's in one line."""
    vae, clip_l, clip_g, t5, tokenizer, tokenizer_g, tokenizer_t5 = source_parts(
        pipe, "vae", "text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3")
    c = pipe.transformer.config
    clip_width = clip_l.config.hidden_size + clip_g.config.hidden_size
    pooled = clip_l.config.projection_dim + clip_g.config.projection_dim
    if c.joint_attention_dim != t5.config.d_model or clip_width > c.joint_attention_dim \
            or c.pooled_projection_dim != pooled:
        raise WorkbenchError(f"config key 'model.init_from': the transformer's joint_attention_dim and "
                             f"pooled_projection_dim must be {t5.config.d_model} (T5's width, at least both CLIP "
                             f"towers' {clip_width}) and {pooled} (both CLIP towers' projections)")
    return ThreeTowerMMDiT(source_denoiser(cfg, pipe.transformer), with_recorded_shift(vae), clip_l, tokenizer,
                           clip_g, t5, ClipIds(tokenizer, tokenizer_g), flow=source_flow(cfg, pipe),
                           text_tokens=cfg.model.text_tokens, tokenizer_3=tokenizer_t5, **caption_options(cfg))


RECIPE = Recipe(families=("sd3",), model=RectifiedFlowTransformer, build=build_transformer_model,
                from_pipeline=transformer_model_from)
