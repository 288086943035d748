"""A run that starts from a model the user holds (``model.init_from``): the checkpoint door opens it (a diffusers
folder, a hub id, a single file, one of this workbench's checkpoints), its family's recipe builds the training model
around the pipeline's own parts, and where the config asks for one, an adapter is added to its denoiser
(``models.adapters``), and with ``adapter.text_encoders`` a LoRA to its CLIP towers: the base weights then stay frozen
and leave every checkpoint, which holds the adapters, their optimizer state and EMA, and names the base by its
content hash."""
from __future__ import annotations

from models.errors import WorkbenchError

from ..config import TrainConfig
from .latent_diffusion import LatentDiffusion


def opened_source(cfg: TrainConfig):
    """(the found checkpoint, its pipeline in float32 on the CPU, its family): one line naming the key where the
    door refuses it. A Composer checkpoint gives its EMA weights where it holds them, as every command opens it."""
    from models.checkpoints import find_checkpoint, load_pipeline, weights_of
    from models.families import family_of_pipeline

    try:
        ckpt = find_checkpoint(cfg.model.init_from)
        pipe = load_pipeline(ckpt, ema=weights_of(ckpt) == "ema", device="cpu")
    except WorkbenchError as e:
        raise WorkbenchError(f"config key 'model.init_from': {e}") from None
    return ckpt, pipe, family_of_pipeline(pipe)


def model_from_source(cfg: TrainConfig, recipe_for) -> LatentDiffusion:
    """The training model around ``model.init_from``'s parts, by its family's recipe (``recipe_for``: the registry's
    lookup), with the adapter of the config's ``adapter`` section where it names one."""
    from models.checkpoints import content_hash

    ckpt, pipe, family = opened_source(cfg)
    model = recipe_for(family).from_pipeline(cfg, pipe)
    model.family = family.name  # the entry that assembles its pipeline: SD 1's, where the source is SD 1
    model.source = {"init_from": cfg.model.init_from, "kind": ckpt.kind, "family": family.name,
                    "content_hash": content_hash(ckpt)}
    if cfg.adapter.type is not None:
        add_trained_adapter(model, cfg)
        if cfg.adapter.text_encoders:
            add_text_adapters(model, pipe, family)
    return model


def add_trained_adapter(model: LatentDiffusion, cfg: TrainConfig) -> None:
    """The config's adapter on the model's denoiser, whose own weights are frozen; the model's state (what Composer
    saves and loads) then holds the adapter's weights alone (``is_adapter_key``)."""
    from models.adapters import add_adapter, adapter_kind

    a = cfg.adapter
    model.denoiser.requires_grad_(False)
    config = add_adapter(model.denoiser, model.family, kind=a.type, rank=a.rank, alpha=a.alpha, dropout=a.dropout,
                         targets=a.targets)
    for name, p in model.denoiser.named_parameters():
        p.requires_grad_(_is_adapter(name))
    model.adapter = {"type": adapter_kind(config), "rank": config.r,
                     "alpha": float(getattr(config, "lora_alpha", None) or getattr(config, "alpha", None)),
                     "dropout": float(getattr(config, "lora_dropout", None) or getattr(config, "rank_dropout", 0.0)),
                     "targets": sorted(config.target_modules), "peft_config": _plain_peft_config(config)}
    model._register_state_dict_hook(_adapter_state_only)


# the text towers' LoRA targets: each CLIP layer's attention, as diffusers' train_dreambooth_lora_sdxl.py adapts them
TEXT_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")


def add_text_adapters(model: LatentDiffusion, pipe, family) -> None:
    """A LoRA of the denoiser's rank and alpha on each text tower of the model that diffusers' LoRA loader of the
    family's pipeline adapts (``models.adapters.adaptable_text_encoders``: CLIP towers, no T5), its base frozen; the
    model then encodes captions with gradients in training (``trains_text``). No dropout: the towers run in eval
    mode (``LatentDiffusion.train``), where a dropout would not act."""
    from models.adapters import adapter_config, adaptable_text_encoders

    a = model.adapter
    towers, seen = {}, set()
    for name in adaptable_text_encoders(pipe, family):
        tower = getattr(model, name, None)
        if tower is None or id(tower) in seen:  # a tower the model does not hold, or holds in two slots
            continue
        seen.add(id(tower))
        config = adapter_config("lora", a["rank"], a["alpha"], 0.0, TEXT_TARGETS)  # one per tower
        tower.add_adapter(config)
        for key, p in tower.named_parameters():
            p.requires_grad_(_is_adapter(key))
        towers[name] = _plain_peft_config(config)
    if not towers:
        raise WorkbenchError(f"config key 'adapter.text_encoders': {family.label}'s pipeline has no text tower that "
                             "diffusers' LoRA loader adapts")
    a["text_encoders"] = towers
    model.trains_text = True


def _is_adapter(key: str) -> bool:
    from models.adapters import is_adapter_key

    return is_adapter_key(key)


def _adapter_state_only(module, state_dict, prefix, local_metadata) -> None:
    """A state-dict hook: every key but the adapter's leaves (the base comes from ``model.init_from``, by hash)."""
    for key in [k for k in state_dict if not _is_adapter(k)]:
        del state_dict[key]


def _plain_peft_config(config) -> dict:
    """peft's config as plain data (sets as sorted lists), which a weights-only load reads back."""
    import json

    data = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    return json.loads(json.dumps(data, default=str))
