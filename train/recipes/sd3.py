"""SD3/3.5: an MMDiT on rectified flow at SD3's resolution shift, conditioned on one CLIP tower's states and pooled
output in each of the family's CLIP slots (``RectifiedFlowTransformer``)."""
from __future__ import annotations

from models.errors import WorkbenchError

from ..config import TrainConfig
from .denoiser import caption_options, prepared_denoiser, source_denoiser, source_parts, with_recorded_shift
from .latent_diffusion import RectifiedFlowTransformer
from .recipe import Recipe


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


def transformer_model_from(cfg: TrainConfig, pipe) -> RectifiedFlowTransformer:
    """An SD3 pipeline whose one CLIP tower fills both CLIP slots and that has no T5 (a checkpoint of this
    workbench's MMDiT architectures), on rectified flow at its sampler's shift (``model.flow_shift`` over it). SD3's
    own three towers (CLIP-L, CLIP-G, T5) are refused in one line: this recipe conditions on one."""
    from models.families import RectifiedFlow

    m = cfg.model
    if pipe.text_encoder_2 is not pipe.text_encoder or getattr(pipe, "text_encoder_3", None) is not None:
        raise WorkbenchError("config key 'model.init_from': SD3's own text towers (two CLIP towers and T5) are not "
                             "trained here yet; the SD3 recipe fine-tunes this workbench's MMDiT checkpoints")
    vae, text_encoder, tokenizer = source_parts(pipe, "vae", "text_encoder", "tokenizer")
    shift = m.flow_shift if m.flow_shift is not None else float(pipe.scheduler.config.get("shift", 1.0))
    flow = RectifiedFlow(logit_mean=m.logit_mean, logit_std=m.logit_std, shift=shift, weighting=m.loss_weighting,
                         sampling=m.timestep_sampling)
    return RectifiedFlowTransformer(source_denoiser(cfg, pipe.transformer), with_recorded_shift(vae), text_encoder,
                                    tokenizer, flow=flow, clip_slots=2, **caption_options(cfg))


RECIPE = Recipe(families=("sd3",), model=RectifiedFlowTransformer, build=build_transformer_model,
                from_pipeline=transformer_model_from)
