"""Adapter files from anywhere applied to an opened pipeline, each at a strength: ``apply_adapters``.

Every file is judged first (``check_adapter_file``: a pickle, a key outside the denoiser and the text encoders, a
shape that does not fit, a rank bomb are refused before any tensor is read); a file whose keys name layers of another
family's denoiser is refused in one line naming that family, found by matching its keys against each family's
full-size denoiser built on the meta device. Text encoders' keys (kohya's ``lora_te_``/``lora_te1_``/``lora_te2_``,
diffusers' ``text_encoder.``/``text_encoder_2.``) are judged against the pipeline's towers that diffusers' loader
adapts (``adaptable_text_encoders``) and applied like the denoiser's, by the same route.

Then, by what the file holds:

- a LoRA in the diffusers, kohya or ComfyUI layout (kohya's, AUTOMATIC1111's, SDXL's ``input_blocks`` names, Flux.1's
  fused layers; ComfyUI's ``diffusion_model.`` names handed over as kohya's): diffusers' own ``load_lora_weights``
  reads it (its converters split and rename), one peft adapter per file, and ``set_adapters(names, strengths)``
  stacks them;
- what plain diffusers refuses or drops (LoHa, LoKr, LyCORIS' ``dora_scale``, and the peft layout, whose alpha
  lives in its ``peft_config`` metadata where diffusers reads none): its delta merged into the weights of the
  denoiser and the text encoders by the format's own formula, ``strength`` multiplying the delta (inside DoRA's
  normalisation, as peft scales it):

  - LoRA: ``up @ down * scale``;
  - LoHa: ``(w1_a @ w1_b) * (w2_a @ w2_b) * scale``;
  - LoKr: ``kron(w1, w2) * scale``, each of ``w1``, ``w2`` whole or ``a @ b``;
  - DoRA: ``m * W' / ||W'||`` with ``W' = W + up @ down * scale``, the norm per output row for peft's
    ``lora_magnitude_vector`` and per input column for LyCORIS' ``dora_scale`` of the inputs' length.

  ``scale`` is the file's ``alpha / rank`` (peft: its config's, with ``rank_pattern``/``alpha_pattern``; rsLoRA's
  ``alpha / sqrt(rank)``), 1 where the file gives no alpha (as ComfyUI reads it), and for a LoKr in LyCORIS' names
  1 where neither side is factored (LyCORIS trains such a LoKr with alpha set to its rank).

A merged file changes the pipeline's weights: the pipeline is for this drawing, as `dwb sample` opens one per call.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..common import loads_outside, sha256_of
from ..errors import WorkbenchError, first_line
from ..families import FAMILIES, build_on_meta, family_named, family_of_pipeline
from ..generation import MAX_STRENGTH
from ..readers import read_safetensors_head
from .adding import denoiser_layers
from .reading import (COMFYUI_PREFIX, ROLES, AdapterFile, _check_group, _group, _sizes, _split, adaptable_layers,
                      check_adapter_file, comfyui_as_kohya_name)
from .writing import PEFT_CONFIG_KEY


@dataclass(frozen=True)
class AppliedAdapter:
    name: str  # the file's stem, as AUTOMATIC1111 names a LoRA
    hash: str  # AUTOMATIC1111's short hash: the first 12 hex digits of the sha256 after the header
    strength: float
    kind: str  # lora, dora, loha, lokr
    layout: str  # diffusers, kohya, peft
    merged: bool  # merged into the weights (True) or a peft adapter diffusers loaded (False)


def parse_adapter_arg(text: str) -> tuple[Path, float]:
    """``FILE[:STRENGTH]`` -> (file, strength); 1.0 where no strength is given."""
    head, sep, tail = text.rpartition(":")
    if sep and head and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", tail.strip()):
        strength = float(tail)
        if not abs(strength) <= MAX_STRENGTH:
            raise WorkbenchError(f"adapter strength {tail} is outside -{MAX_STRENGTH:g} to {MAX_STRENGTH:g}")
        return Path(head), strength
    return Path(text), 1.0


def a1111_short_hash(path: Path, header_bytes: int) -> str:
    """AUTOMATIC1111's ``Lora hashes`` value: the first 12 hex digits of the sha256 of the bytes after the header
    (kohya's ``addnet_hash_safetensors``, ``kohya_hashes``' first)."""
    return sha256_of(path, 8 + header_bytes)[:12]


def _names_layers(head, denoiser, family, shapes: bool = False) -> bool:
    """Whether every key of ``head`` but the text encoders' names a layer of ``denoiser`` (names alone; with
    ``shapes``, each layer's tensors fitting it too)."""
    layers = denoiser_layers(denoiser)
    try:
        _, groups = _group(head, denoiser, family, layers, Path("?"), towers=None)
        for paths, suffixes in groups.items() if shapes else ():
            _check_group(suffixes, *_sizes(layers, paths), paths[0])
    except WorkbenchError:
        return False
    return True


@lru_cache(maxsize=None)
def _full_size_on_meta(name: str) -> torch.nn.Module:
    """The family's first variant's full-size denoiser on the meta device (nothing allocated), built once."""
    family = family_named(name)
    return build_on_meta(family.variants[0].parts[family.denoiser])


def _family_it_fits(path: Path, head, own) -> str:
    """The family (or families, "A or B") whose full-size denoiser the file's keys name, or "" where none does;
    where several share the names, those whose shapes fit too."""
    named = []
    for family in FAMILIES:
        if family is own:
            continue
        denoiser = _full_size_on_meta(family.name)
        if _names_layers(head, denoiser, family):
            named.append((family, denoiser))
    fitting = [family for family, denoiser in named if _names_layers(head, denoiser, family, shapes=True)]
    return " or ".join(f.label for f in (fitting if len(fitting) == 1 else [f for f, _ in named]))


def adaptable_text_encoders(pipe, family) -> dict[str, torch.nn.Module]:
    """The pipeline's text encoders an adapter file may adapt: the family's that the pipeline holds and that
    diffusers' LoRA loader of its class adapts (``_lora_loadable_modules``: SD's and SDXL's CLIP towers, SD3's two
    CLIP towers, Flux.1's CLIP-L; not a T5)."""
    loadable = getattr(pipe, "_lora_loadable_modules", ())
    return {name: getattr(pipe, name) for name in family.text_encoders
            if name in loadable and getattr(pipe, name, None) is not None}


def adaptable_copy(pipe):
    """A pipeline of ``pipe``'s class around copies of what applying adapters changes (its denoiser and the text
    towers ``adaptable_text_encoders`` names), sharing every other part and its saved settings: adapters applied to
    the copy, at any strength, leave ``pipe`` as it was, and nothing is read from the checkpoint again."""
    import copy

    family = family_of_pipeline(pipe)
    owned = {family.denoiser: getattr(pipe, family.denoiser), **adaptable_text_encoders(pipe, family)}
    _, optional = type(pipe)._get_signature_keys(type(pipe))
    saved = {k: v for k, v in pipe.config.items() if k in optional and isinstance(v, (bool, int, float, str))}
    copied = type(pipe)(**{**pipe.components, **saved, **{name: copy.deepcopy(m) for name, m in owned.items()}})
    copied.set_progress_bar_config(disable=True)
    return copied


def judge_adapter_file(path: str | Path, denoiser: torch.nn.Module, family,
                       text_encoders: dict | None = None) -> AdapterFile:
    """``check_adapter_file`` against ``denoiser`` and ``text_encoders`` (``adaptable_text_encoders``), with a file
    whose denoiser keys name no layer of ``denoiser`` refused in one line naming the family it looks made for (or
    saying it fits none)."""
    path = Path(path)
    try:
        return check_adapter_file(path, denoiser, family.name, text_encoders=text_encoders)
    except WorkbenchError as refused:
        try:
            head = read_safetensors_head(path)
        except WorkbenchError:
            raise refused from None
        if not head.tensors or _names_layers(head, denoiser, family):
            raise refused from None
        other = _family_it_fits(path, head, family)
        where = f"{family.label}'s {type(denoiser).__name__}"
        if other:
            raise WorkbenchError(f"{path}: an adapter for {other}, not {family.label}: its keys name layers of "
                                 f"{other}'s denoiser and not of {where}") from None
        raise WorkbenchError(f"{path}: its keys match no layer of {where} nor of any other family's "
                             f"denoiser ({', '.join(f.label for f in FAMILIES if f is not family)})") from None


def _through_diffusers(info: AdapterFile) -> bool:
    """Whether diffusers' ``load_lora_weights`` reads the file whole: a LoRA (or a diffusers-layout DoRA, whose
    magnitudes it loads) in the layouts it converts; the peft layout keeps its alpha where diffusers reads none."""
    return (info.kind == "lora" and info.layout in ("diffusers", "kohya", "comfyui")) or \
        (info.kind == "dora" and info.layout == "diffusers")


def apply_adapters(pipe, adapters) -> list[AppliedAdapter]:
    """Apply each ``(file, strength)`` of ``adapters`` to ``pipe`` (a pipeline ``models.checkpoints.load_pipeline``
    opened), every file judged before any is read; returns what was applied, in order."""
    adapters = [(Path(p), float(s)) for p, s in adapters]
    if not adapters:
        return []
    family = family_of_pipeline(pipe)
    denoiser = getattr(pipe, family.denoiser)
    text_encoders = adaptable_text_encoders(pipe, family)
    judged = [judge_adapter_file(path, denoiser, family, text_encoders) for path, _ in adapters]
    applied, names, strengths = [], [], []
    for i, ((path, strength), info) in enumerate(zip(adapters, judged)):
        head = read_safetensors_head(path)
        through = _through_diffusers(info)
        if through:
            name = f"adapter_{i}"
            try:
                pipe.load_lora_weights(str(path) if info.layout != "comfyui" else comfyui_as_kohya(path),
                                       adapter_name=name)
            except (ValueError, KeyError, RuntimeError) as e:  # diffusers' converters raise these on what they miss
                raise WorkbenchError(f"{path}: diffusers' LoRA reader refused it: {first_line(e)}") from None
            names.append(name)
            strengths.append(strength)
        else:
            merge_adapter_file(denoiser, family, path, head, strength, text_encoders)
        applied.append(AppliedAdapter(path.stem, a1111_short_hash(path, head.header_bytes), strength, info.kind,
                                      info.layout, not through))
    if names:
        pipe.set_adapters(names, strengths)
    return applied


KOHYA_SUFFIXES = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight",
                  "lora.down.weight": "lora_down.weight", "lora.up.weight": "lora_up.weight"}


def comfyui_as_kohya(path: Path) -> dict[str, torch.Tensor]:
    """A judged LoRA in ComfyUI's layout as the kohya layout's state dict, which diffusers' kohya converters read
    (the names are the same with underscores; peft's ``lora_A``/``lora_B`` are kohya's down and up)."""
    from safetensors.torch import load_file

    state = {}
    for key, tensor in load_file(str(path)).items():
        module, suffix = _split(key, path)
        if module.startswith(COMFYUI_PREFIX):
            module = comfyui_as_kohya_name(module)
        state[f"{module}.{KOHYA_SUFFIXES.get(suffix, suffix)}"] = tensor
    return state


def _pattern_value(pattern, module: str, default):
    """peft's ``rank_pattern``/``alpha_pattern`` lookup, its keys taken as text, not as the regular expressions peft
    allows (a pattern from a file could take exponential time to match): the module path or its dotted tail."""
    for key, value in (pattern if isinstance(pattern, dict) else {}).items():
        if module == key or module.endswith("." + key):
            return value
    return default


def _peft_scale(config: dict, module: str, rank: int, path: Path) -> float:
    """``alpha / r`` (rsLoRA: ``alpha / sqrt(r)``) of one layer, as peft's config in the file says."""
    alpha_key = "lora_alpha" if "lora_alpha" in config else "alpha"
    r = _pattern_value(config.get("rank_pattern"), module, config.get("r", rank))
    alpha = _pattern_value(config.get("alpha_pattern"), module, config.get(alpha_key, r))
    for value in (r, alpha):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < abs(value) < 1e6:
            raise WorkbenchError(f"{path}: its peft_config gives {module} a rank or alpha of {str(value)[:40]!r}")
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with a convolution's trailing kernel dimensions kept on ``b``'s side."""
    return (a.flatten(1) @ b.flatten(1)).reshape(a.shape[0], *b.shape[1:])


def _lokr_delta(t: dict) -> tuple[torch.Tensor, int]:
    """(kron(w1, w2), the factored rank or 0 where neither side is factored)."""
    sides, rank = [], 0
    for w in ("w1", "w2"):
        whole = t.get(f"lokr_{w}")
        if whole is None:
            a, b = t[f"lokr_{w}_a"], t[f"lokr_{w}_b"]
            whole, rank = _product(a, b), a.shape[1]
        sides.append(whole)
    w1, w2 = sides
    if w2.dim() == 4:
        w1 = w1[:, :, None, None]
    return torch.kron(w1, w2), rank


def _delta(t: dict) -> tuple[str, torch.Tensor, int]:
    """(kind, the unscaled delta, the rank alpha divides by; 0: alpha does not apply) of one layer's tensors."""
    if "hada_w1_a" in t:
        return "loha", _product(t["hada_w1_a"], t["hada_w1_b"]) * _product(t["hada_w2_a"], t["hada_w2_b"]), \
            t["hada_w1_b"].shape[0]
    if any(k.startswith("lokr_") for k in t):
        delta, rank = _lokr_delta(t)
        return "lokr", delta, rank
    down = next(tensor for suffix, tensor in t.items() if ROLES[suffix] == "down")
    up = next(tensor for suffix, tensor in t.items() if ROLES[suffix] == "up")
    return "lora", _product(up, down), down.shape[0]


def _layer_scale(t: dict, kind: str, rank: int, config: dict | None, module: str, path: Path) -> float:
    if config is not None:
        return _peft_scale(config, module, rank, path)
    if "alpha" not in t or (kind == "lokr" and rank == 0):
        return 1.0
    return float(t["alpha"].float().item()) / rank


def _dora(weight: torch.Tensor, delta: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """DoRA's weight: ``magnitude`` times ``weight + delta`` normalised per output row (peft's, a magnitude of the
    outputs' length) or per input column (LyCORIS' ``dora_scale`` of the inputs' length)."""
    adapted = (weight + delta).flatten(1)
    per_output = magnitude.numel() == adapted.shape[0]
    norm = adapted.norm(dim=1, keepdim=True) if per_output else adapted.norm(dim=0, keepdim=True)
    m = magnitude.reshape(-1, 1) if per_output else magnitude.reshape(1, -1)
    return (m * adapted / norm).reshape(weight.shape)


def merge_adapter_file(denoiser: torch.nn.Module, family, path: Path, head, strength: float,
                       text_encoders: dict | None = None) -> None:
    """Merge a judged file's deltas into the weights of ``denoiser`` and ``text_encoders`` at ``strength`` (the
    formulas are the module's note); a fused kohya layer's delta split over its members by their outputs."""
    from safetensors import safe_open

    layers = adaptable_layers(denoiser, text_encoders)
    _, groups = _group(head, denoiser, family, layers, path, tuple(text_encoders or ()))
    config = None
    if PEFT_CONFIG_KEY in head.metadata:
        config = loads_outside(head.metadata[PEFT_CONFIG_KEY], f"{path}: its {PEFT_CONFIG_KEY}")
        if not isinstance(config, dict):
            raise WorkbenchError(f"{path}: its {PEFT_CONFIG_KEY} is not a JSON object")
    key_of = {id(entry): key for key, entry in head.tensors.items()}  # _group's entries are the head's own
    with safe_open(str(path), framework="pt") as f, torch.no_grad():
        for paths, suffixes in groups.items():
            t = {suffix: f.get_tensor(key_of[id(entry)]).float() for suffix, entry in suffixes.items()}
            kind, delta, rank = _delta(t)
            scale = _layer_scale(t, kind, rank, config, paths[0], path) * strength
            magnitude = t.get("lora_magnitude_vector", t.get("dora_scale"))
            if magnitude is not None and len(paths) > 1:
                raise WorkbenchError(f"{path}: a DoRA on the fused layer {paths[0]} and others is not applied here")
            start = 0
            for member in paths:
                weight = layers[member].weight
                part = delta[start:start + weight.shape[0]].reshape(weight.shape) * scale
                start += weight.shape[0]
                base = weight.float()
                merged = base + part if magnitude is None else _dora(base, part, magnitude)
                weight.copy_(merged.to(weight.dtype))

