"""Building and loading the parts of a latent-diffusion model: UNet, VAE, text encoder, tokenizer, schedulers.

``pretrained`` is a folder or hub id in the diffusers layout (``vae/``, ``text_encoder/``,
``tokenizer/``), or a single-file checkpoint in the original Stable Diffusion layout (``.safetensors``,
``.ckpt``: ``models.checkpoints.single_file``). A missing part is one clear error naming the folder and the part.
"""
from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from .architectures import ARCHITECTURES, denoiser_config
from ..errors import WorkbenchError, first_line

def build_unet(architecture: str, overrides: dict | None = None) -> UNet2DConditionModel:
    return UNet2DConditionModel(**denoiser_config(architecture, overrides))


def random_text_encoder(architecture: str, vocab_size: int | None = None, seed: int = 0, *,
                        part: str = "text_encoder", token_ids: dict | None = None) -> CLIPTextModel:
    """The architecture's text tower ``part`` with random weights: SDXL's second (``text_encoder_2``) with its
    pooled output projected; ``token_ids`` (``bos_token_id``, ...) where the tokenizer's are not CLIP's."""
    from transformers import CLIPTextModelWithProjection

    arch = ARCHITECTURES[architecture]
    cfg = {**arch[part], **(token_ids or {})}
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
    torch.manual_seed(seed)
    model = (CLIPTextModelWithProjection if part == "text_encoder_2" else CLIPTextModel)(CLIPTextConfig(**cfg))
    std = arch.get("embedding_std")
    if std is not None:
        emb = model.text_model.embeddings
        torch.nn.init.normal_(emb.token_embedding.weight, std=std)
        torch.nn.init.normal_(emb.position_embedding.weight, std=std)
    return model


def random_vae(architecture: str) -> AutoencoderKL:
    return AutoencoderKL(**ARCHITECTURES[architecture]["vae"])


def pretrained_folder(ref: str) -> Path:
    """The local folder of ``model.pretrained``: a folder as given, or a hub id's snapshot (``models.checkpoints.hub``:
    from the local cache, downloaded when online and ``HF_HUB_OFFLINE`` is not set)."""
    from .hub import hub_offline, is_hub_id, resolve_hub

    return resolve_hub(ref, allow_download=not hub_offline()) if is_hub_id(ref) else Path(ref)


def is_part_folder(path: Path) -> bool:
    """A single part saved on its own (``save_pretrained`` of a VAE, text encoder or tokenizer)."""
    return path.is_dir() and any((path / f).is_file() for f in ("config.json", "tokenizer_config.json", "vocab.json"))


def names_a_single_file(ref: str) -> bool:
    """``ref`` is a file with a single-file suffix (what it holds is checked when it loads, in one line);
    ``single_file.is_single_file`` also reads its keys."""
    from .single_file import SUFFIXES

    return Path(ref).suffix in SUFFIXES and Path(ref).is_file()


def single_file_parts(ref: str) -> tuple[AutoencoderKL, CLIPTextModel, CLIPTokenizer]:
    """VAE, text encoder and tokenizer of a single-file checkpoint (its UNet is read, then dropped)."""
    from .single_file import load_single_file

    pipe = load_single_file(Path(ref))
    return pipe.vae, pipe.text_encoder, pipe.tokenizer


def load_part(cls, ref: str, subfolder: str, what: str, **options):
    """One pretrained part: ``ref`` is the part's own folder, a diffusers-layout root, a hub id or a single file
    (which is read whole for each part); ``options`` go to its ``from_pretrained``."""
    if names_a_single_file(ref):
        return single_file_parts(ref)[("vae", "text_encoder", "tokenizer").index(subfolder)]
    folder = Path(ref) if is_part_folder(Path(ref)) else pretrained_folder(ref) / subfolder
    if not folder.is_dir():
        hint = " (run `dwb prepare` to build the tiny components)" if not Path(ref).exists() else ""
        raise WorkbenchError(f"pretrained {what} not found: {folder} does not exist{hint}")
    try:
        return cls.from_pretrained(folder, local_files_only=True, **options)
    except WorkbenchError:
        raise
    except Exception as e:  # hub unreachable, missing file, unreadable weights
        raise WorkbenchError(f"cannot load pretrained {what} from '{folder}': {first_line(e)}") from None


def load_frozen_parts(pretrained: str, dtype: torch.dtype | None = None,
                      ) -> tuple[AutoencoderKL, CLIPTextModel, CLIPTokenizer]:
    """VAE, text encoder and tokenizer from a diffusers-layout folder, a hub id or a single file; ``dtype``: the
    VAE and text encoder loaded in it (``frozen.hold_in``'s rule), else in float32."""
    from .frozen import hold_in, load_options

    if names_a_single_file(pretrained):
        vae, text_encoder, tokenizer = single_file_parts(pretrained)
        return (vae, text_encoder, tokenizer) if dtype is None else (hold_in(vae, dtype), hold_in(text_encoder, dtype),
                                                                     tokenizer)
    vae = load_part(AutoencoderKL, pretrained, "vae", "VAE", **load_options(AutoencoderKL, dtype))
    text_encoder = load_part(CLIPTextModel, pretrained, "text_encoder", "text encoder",
                             **load_options(CLIPTextModel, dtype))
    tokenizer = load_part(CLIPTokenizer, pretrained, "tokenizer", "tokenizer")
    return vae, text_encoder, tokenizer


def build_transformer(architecture: str, overrides: dict | None = None):
    """The architecture's transformer with random weights, of its family's diffusers class (SD3's
    ``SD3Transformer2DModel``, Flux.1's ``FluxTransformer2DModel``)."""
    import diffusers

    from ..families import family_named

    family = family_named(ARCHITECTURES[architecture]["family"])
    cls = getattr(diffusers, family.variants[0].parts[family.denoiser].cls)
    return cls(**denoiser_config(architecture, overrides))


def with_projection(text_encoder: CLIPTextModel):
    """The text tower as SD3's pipeline takes it (``CLIPTextModelWithProjection``: its pooled output projected):
    the same weights, and a square identity projection, so the pooled output is the tower's own."""
    from transformers import CLIPTextModelWithProjection

    config = CLIPTextConfig.from_dict({**text_encoder.config.to_dict(), "projection_dim": text_encoder.config.hidden_size})
    tower = CLIPTextModelWithProjection(config)
    tower.text_model.load_state_dict(text_encoder.text_model.state_dict())
    with torch.no_grad():
        tower.text_projection.weight.copy_(torch.eye(config.hidden_size))
    return tower.to(text_encoder.dtype).eval()  # held as the tower it wraps (a GPU run's half precision)


SECOND_TOWER_SEED = 1  # the first tower `dwb prepare` builds is seeded 0


def builds_second_tower(architecture: str, pretrained: str | None) -> bool:
    """Whether a run builds its second text tower (random, with the first tokenizer's vocabulary and ids) rather than
    load it from ``pretrained``'s ``text_encoder_2/``: where the architecture builds it, or nothing is pretrained."""
    return bool(ARCHITECTURES[architecture].get("builds_text_encoder_2")) or pretrained is None


def second_text_encoder(architecture: str, pretrained: str | None, tokenizer, dtype: torch.dtype | None = None):
    """SDXL's second text tower (``CLIPTextModelWithProjection``): built from the architecture's config, random and
    with the tokenizer's vocabulary and start, end and padding ids, where the architecture builds it or no
    ``pretrained`` is given; else ``pretrained``'s ``text_encoder_2/``, loaded in ``dtype`` where given."""
    from transformers import CLIPTextModelWithProjection

    if builds_second_tower(architecture, pretrained):
        ids = {} if tokenizer is None else {"bos_token_id": tokenizer.bos_token_id,
                                            "eos_token_id": tokenizer.eos_token_id,
                                            "pad_token_id": tokenizer.pad_token_id}
        return random_text_encoder(architecture, None if tokenizer is None else len(tokenizer), SECOND_TOWER_SEED,
                                   part="text_encoder_2", token_ids=ids)
    if names_a_single_file(pretrained):
        raise WorkbenchError(f"config key 'model.pretrained': {architecture} takes its frozen parts from a diffusers "
                             f"folder or hub id with text_encoder_2/ (SDXL's), not a single file")
    from .frozen import load_options

    return load_part(CLIPTextModelWithProjection, pretrained, "text_encoder_2", "second text encoder",
                     **load_options(CLIPTextModelWithProjection, dtype))


def second_tokenizer(architecture: str, pretrained: str | None) -> CLIPTokenizer | None:
    """The second text tower's own tokenizer where ``second_text_encoder`` loads the tower: ``pretrained``'s
    ``tokenizer_2/`` (SDXL's pads with "!", its first with the end token); None where the architecture builds the
    tower (it reads the first tokenizer's ids)."""
    if builds_second_tower(architecture, pretrained):
        return None
    return load_part(CLIPTokenizer, pretrained, "tokenizer_2", "second tokenizer")


def with_max_length(tokenizer, tokens: int):
    """``tokenizer``, or a copy of it, whose ``model_max_length`` is ``tokens``, marked as the count a model trained
    here read (``models.families.TRAINED_TOKENS`` in its ``init_kwargs``): a T5's tokenizer telling a pipeline call
    how many tokens its tower was trained on (``Family.text_length``), without changing the tokenizer it is a copy of
    (the tiny Flux.1's T5 reads the CLIP tokenizer's ids, padded to ``model.text_tokens``)."""
    import copy

    from ..families import TRAINED_TOKENS

    if tokenizer is None or tokenizer.init_kwargs.get(TRAINED_TOKENS) == tokens == tokenizer.model_max_length:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.model_max_length = tokens
    tokenizer.init_kwargs[TRAINED_TOKENS] = tokens  # saved in tokenizer_config.json: an exported folder says it too
    return tokenizer


def assemble_pipeline(family, parts: dict, tokenizers: dict, settings: dict):
    """A plain diffusers pipeline of ``family`` around parts built here (a spec's, a training run's), as its entry
    assembles one (``Family.assembly``): ``parts`` by component name (the denoiser, ``vae``, the text encoders it
    has), ``tokenizers`` beside them (``tokenizer``, ``tokenizer_2``), ``settings`` what the model was trained with
    (``prediction_type``, ``shift``). A text encoder it lacks is passed as None unless the family shares another's."""
    import diffusers

    from .schedules import family_scheduler

    assembly = family.assembly
    components = {name: parts.get(name) for name in (family.denoiser, "vae", *family.text_encoders)}
    components |= {name.replace("text_encoder", "tokenizer"): tokenizers.get(name.replace("text_encoder", "tokenizer"))
                   for name in family.text_encoders}
    for name, source in assembly.shared:
        if components.get(name) is None:
            components[name] = components[source]
    pipe = getattr(diffusers, family.pipeline)(scheduler=family_scheduler(family, settings), **components,
                                               **assembly.options)
    pipe.set_progress_bar_config(disable=True)
    return pipe
