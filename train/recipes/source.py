"""A run that starts from a model the user holds (``model.init_from``): the checkpoint door opens it (a diffusers
folder, a hub id, a single file, one of this workbench's checkpoints), its family's recipe builds the training model
around the pipeline's own parts, and where the config asks for one, an adapter is added to its denoiser
(``models.adapters``): the denoiser's own weights then stay frozen and leave every checkpoint, which holds the
adapter, its optimizer state and EMA, and names the base by its content hash."""
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
