"""An adapter file from elsewhere judged before any tensor of it is read: ``check_adapter_file``.

What it refuses, each in one line naming the file (tests/adapters/test_hostile_adapters.py, one test each):

- a pickle (``.pt``, ``.ckpt``, ``.bin``, ...): never opened, since unpickling runs whatever code the file names;
- a symbolic link or anything but a regular file (a link named ``style.safetensors`` can lead anywhere on the disk:
  ``models.readers.outside_root``), and a file over ``max_bytes``;
- a header out of bounds (``models.readers.read_safetensors_head``: its length, its JSON, each tensor's byte range
  and declared size against the file);
- a key that names no layer of the denoiser nor of a text encoder given beside it (kohya's ``lora_te_``,
  ``lora_te1_``, ``lora_te2_`` names, as the family's entry in ``kohya.KOHYA_TEXT_PREFIXES`` says, and diffusers'
  ``text_encoder.``/``text_encoder_2.`` ones): a tower the family does not have, or one not given, is refused in one
  line naming the family; a suffix no adapter kind writes;
- a tensor whose shape does not fit its layer, and a "rank bomb": a rank above the layer's full rank
  (``min(inputs, outputs)``), a tensor larger than the layer's weight, found from the header's shapes, so
  nothing is allocated for it.

The layouts it takes are the ones ``write_adapter`` writes and the ones they stand for elsewhere: ``unet.`` /
``transformer.`` keys with peft's or diffusers' names (``lora_A``/``lora_B``, ``lora.down``/``lora.up``,
``lora_magnitude_vector``, LoHa's ``hada_*``, LoKr's ``lokr_*``), and kohya's ``lora_unet_`` keys (``lora_down``,
``lora_up``, ``alpha``, LyCORIS' ``dora_scale``, ``hada_*``, ``lokr_*``) under diffusers' names, the original UNet's
``input_blocks``/``middle_block``/``output_blocks`` names of the attention blocks, or Flux.1's fused layers; and
ComfyUI's ``diffusion_model.`` keys, the same names with their dots (``comfyui_as_kohya_name``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import WorkbenchError
from ..families import family_named
from ..readers import outside_root, read_safetensors_head
from .adding import denoiser_layers
from .kohya import KOHYA_TEXT_PREFIXES, PREFIX, flux_kohya_name, flux_members
from .writing import PEFT_CONFIG_KEY

MAX_ADAPTER_BYTES = 4 << 30  # 4 GiB: a rank-128 LoRA on all of Flux.1's layers is 1.2 GB in float32
PICKLES = (".pt", ".pth", ".ckpt", ".bin", ".pkl", ".pickle")
FLOATS = ("F16", "BF16", "F32", "F64")
INTEGERS = ("I8", "I16", "I32", "I64", "U8")  # an alpha alone may be one: diffusers' convert_state_dict_to_kohya
# suffix -> its role; the longest suffixes first, so "lora.down.weight" is not taken for "down.weight"
# (``lora_linear_layer``: diffusers' convert_state_dict_to_diffusers names a text encoder's LoRA so)
ROLES = {"lora_A.weight": "down", "lora_B.weight": "up", "lora.down.weight": "down", "lora.up.weight": "up",
         "lora_linear_layer.down.weight": "down", "lora_linear_layer.up.weight": "up",
         "lora_down.weight": "down", "lora_up.weight": "up", "lora_magnitude_vector": "magnitude",
         "dora_scale": "magnitude", "alpha": "alpha", **{f"hada_w{i}_{ab}": "hada" for i in (1, 2) for ab in "ab"},
         **{f"lokr_{w}": "lokr" for w in ("w1", "w2", "w1_a", "w1_b", "w2_a", "w2_b")}}
SUFFIXES = sorted(ROLES, key=len, reverse=True)
COMFYUI_PREFIX = "diffusion_model."  # ComfyUI's layout: the original model's module paths, dots kept
# how a text tower's keys start: kohya's (lora_te_, lora_te1_, ...) and diffusers' (text_encoder., text_encoder_2.)
TEXT_KEY_STARTS = ("lora_te", "text_encoder")


@dataclass(frozen=True)
class AdapterFile:
    path: Path
    layout: str  # "diffusers", "kohya", "comfyui" or "peft"
    kind: str  # "lora", "dora", "loha", "lokr" (several joined by "+")
    rank: int  # the largest
    layers: int  # the layers it adapts, the denoiser's and the text encoders'
    nbytes: int
    metadata: dict
    text_encoders: tuple[str, ...] = ()  # the text encoders it adapts (their part names)


def _ldm_names(denoiser: torch.nn.Module) -> dict[str, str]:
    """The original UNet's names (``input_blocks.4.1``) of a diffusers UNet's attention blocks, which kohya's SDXL
    LoRAs use; the inverse of diffusers' ``_maybe_map_sgm_blocks_to_diffusers``."""
    per = denoiser.config.layers_per_block
    per = per if isinstance(per, int) else per[0]
    names = {}
    for b, block in enumerate(getattr(denoiser, "down_blocks", [])):
        for j in range(len(getattr(block, "attentions", []) or [])):
            names[f"down_blocks.{b}.attentions.{j}"] = f"input_blocks.{1 + b * (per + 1) + j}.1"
    for b, block in enumerate(getattr(denoiser, "up_blocks", [])):
        for j in range(len(getattr(block, "attentions", []) or [])):
            names[f"up_blocks.{b}.attentions.{j}"] = f"output_blocks.{b * (per + 1) + j}.1"
    if getattr(getattr(denoiser, "mid_block", None), "attentions", None):
        names["mid_block.attentions.0"] = "middle_block.1"
    return names


def _kohya_table(denoiser: torch.nn.Module, family: str, layers: dict) -> dict[str, list[str]]:
    """kohya's layer name (``lora_unet_...``) -> the module paths it stands for (several for Flux.1's fused)."""
    table = {}
    if family == "flux":
        for path in layers:
            found = flux_kohya_name(path)
            if found is not None:
                table[found[0]] = flux_members(found[0]) if found[1] is not None else [path]
        return {name: paths for name, paths in table.items() if all(p in layers for p in paths)}
    ldm = _ldm_names(denoiser) if hasattr(denoiser, "down_blocks") else {}
    for path in layers:
        table[PREFIX + path.replace(".", "_")] = [path]
        for block, original in ldm.items():
            if path.startswith(block + "."):
                table[PREFIX + (original + path[len(block):]).replace(".", "_")] = [path]
    return table


def comfyui_as_kohya_name(module: str) -> str:
    """kohya's name of a layer ComfyUI's layout names (``diffusion_model.`` and the original model's module path,
    dots kept: ``diffusion_model.input_blocks.4.1.proj_in``, ``diffusion_model.double_blocks.0.img_attn.qkv``)."""
    return PREFIX + module[len(COMFYUI_PREFIX):].replace(".", "_")


def is_text_encoder_key(key: str) -> bool:
    """Whether an adapter file's key (or a path of ``adaptable_layers``) belongs to a text encoder."""
    return key.startswith(TEXT_KEY_STARTS)


def adaptable_layers(denoiser: torch.nn.Module, text_encoders: dict | None = None) -> dict[str, torch.nn.Module]:
    """Module path -> each layer an adapter file may adapt: the denoiser's (``denoiser_layers``), and each text
    encoder's under its part name (``text_encoder.text_model.encoder.layers.0.self_attn.q_proj``)."""
    layers = dict(denoiser_layers(denoiser))
    for tower, module in (text_encoders or {}).items():
        layers.update({f"{tower}.{p}": m for p, m in denoiser_layers(module).items()})
    return layers


def _text_key_starts(family) -> str:
    """What the keys of the family's text encoders start with, diffusers' and kohya's names: for a message."""
    kohya = KOHYA_TEXT_PREFIXES.get(family.name, {})
    return "; ".join(f"{t}: {', '.join((t + '.',) + kohya.get(t, ()))}" for t in family.text_encoders)


def _kohya_text_table(family, layers: dict) -> dict[str, str]:
    """kohya's name (``lora_te1_text_model_encoder_layers_0_self_attn_q_proj``) -> the path in ``layers`` of each
    text-encoder layer there."""
    table = {}
    for tower, prefixes in KOHYA_TEXT_PREFIXES.get(family.name, {}).items():
        start = tower + "."
        for p in layers:
            if p.startswith(start):
                table.update({prefix + p[len(start):].replace(".", "_"): p for prefix in prefixes})
    return table


def _text_layer(module: str, key: str, family, layers: dict, kohya_names: dict, towers: tuple[str, ...],
                path: Path) -> str:
    """The path in ``layers`` (the tower's part name, then its module path) of the text-encoder layer ``module``
    names, in kohya's names (``kohya_names``: ``_kohya_text_table``'s) or diffusers' (``text_encoder.text_model.``)."""
    kohya = KOHYA_TEXT_PREFIXES.get(family.name, {})
    tower = next((t for t, prefixes in kohya.items() if module.startswith(prefixes)), None)
    if tower is None and module.partition(".")[0] in family.text_encoders:
        tower = module.partition(".")[0]
    if tower is None:
        raise WorkbenchError(f"{path}: key {key[:160]!r} adapts a text encoder {family.label} does not have (its "
                             f"text encoders' keys start with {_text_key_starts(family)})")
    if tower not in towers:
        raise WorkbenchError(f"{path}: key {key[:160]!r} adapts {family.label}'s {tower}, which takes no adapter "
                             f"here (those that do: {', '.join(towers) or 'none'})")
    found = kohya_names.get(module, module)
    if found not in layers:
        raise WorkbenchError(f"{path}: key {key[:160]!r} names no layer of {family.label}'s {tower}")
    return found


def _split(key: str, path: Path) -> tuple[str, str]:
    for suffix in SUFFIXES:
        if key.endswith("." + suffix):
            return key[:-len(suffix) - 1], suffix
    raise WorkbenchError(f"{path}: key {key[:160]!r} is no adapter weight (no suffix any adapter kind writes)")


def _group(head, denoiser, family, layers: dict, path: Path,
           towers: tuple[str, ...] | None = ()) -> tuple[str, dict[tuple[str, ...], dict]]:
    """(layout, {module paths: {suffix: TensorEntry}}), every key placed on ``layers`` (``adaptable_layers``: the
    denoiser's, and those of the text encoders ``towers`` names); with ``towers`` None, text encoders' keys are
    passed over (a file's denoiser keys matched alone)."""
    prefix = f"{family.denoiser}."
    comfyui = any(k.startswith(COMFYUI_PREFIX) for k in head.tensors)
    kohya = comfyui or any(k.startswith((PREFIX, "lora_te")) for k in head.tensors)
    own = {p: m for p, m in layers.items() if not is_text_encoder_key(p)}
    table = _kohya_table(denoiser, family.name, own) if kohya else {}
    kohya_text = _kohya_text_table(family, layers) if kohya and len(own) < len(layers) else {}
    groups: dict[tuple[str, ...], dict] = {}
    for key, entry in head.tensors.items():
        if towers is None and is_text_encoder_key(key):
            continue
        module, suffix = _split(key, path)
        if module.startswith(COMFYUI_PREFIX):
            module = comfyui_as_kohya_name(module)
        if is_text_encoder_key(module) and kohya == module.startswith("lora_te"):
            paths = (_text_layer(module, key, family, layers, kohya_text, towers, path),)
        elif kohya and module in table:
            paths = tuple(table[module])
        elif not kohya and module.startswith(prefix) and module[len(prefix):] in own:
            paths = (module[len(prefix):],)
        else:
            raise WorkbenchError(f"{path}: key {key[:160]!r} names no layer of the {type(denoiser).__name__}")
        if entry.dtype not in FLOATS and not (suffix == "alpha" and entry.dtype in INTEGERS):
            raise WorkbenchError(f"{path}: tensor {key[:160]!r} is {entry.dtype}, not floating point")
        groups.setdefault(paths, {})[suffix] = entry
    layout = "comfyui" if comfyui else "kohya" if kohya else "peft" if PEFT_CONFIG_KEY in head.metadata else "diffusers"
    return layout, groups


def _sizes(layers: dict, paths: tuple[str, ...]) -> tuple[int, int, int]:
    """(inputs, outputs, the weight's elements) of the layer the module paths make together."""
    mods = [layers[p] for p in paths]
    ins = {m.in_features if isinstance(m, torch.nn.Linear) else m.in_channels for m in mods}
    outs = sum(m.out_features if isinstance(m, torch.nn.Linear) else m.out_channels for m in mods)
    return ins.pop(), outs, sum(m.weight.numel() for m in mods)


def _check_lora(roles: dict, inputs: int, outputs: int, name: str) -> int:
    down, up = roles.get("down"), roles.get("up")
    if down is None or up is None:
        raise WorkbenchError(f"{name}: holds {'an up' if down is None else 'a down'} weight without its pair")
    rank = down.shape[0] if down.shape else 0
    if len(down.shape) < 2 or down.shape[1] != inputs or not 1 <= rank <= min(inputs, outputs):
        raise WorkbenchError(f"{name}: down weight of shape {down.shape} for a layer of {inputs} inputs and "
                             f"{outputs} outputs (its rank may be 1 to {min(inputs, outputs)})")
    if len(up.shape) < 2 or up.shape[:2] != (outputs, rank):
        raise WorkbenchError(f"{name}: up weight of shape {up.shape}, not ({outputs}, {rank}) for this layer")
    magnitude = roles.get("magnitude")
    if magnitude is not None and math.prod(magnitude.shape) not in (outputs, inputs):
        raise WorkbenchError(f"{name}: magnitude of shape {magnitude.shape} for a layer of {outputs} outputs")
    return rank


def _check_lokr(suffixes: dict, inputs: int, outputs: int, name: str) -> int:
    """The largest rank of LoKr's factors, whose Kronecker product must make the layer: ``w1`` (a, b) or
    ``w1_a @ w1_b``, and ``w2`` (c, d, ...) or ``w2_a @ w2_b``, with a * c outputs and b * d inputs."""
    sides, ranks = [], [0]
    for w in ("w1", "w2"):
        whole, a, b = (suffixes.get(f"lokr_{w}{part}") for part in ("", "_a", "_b"))
        if whole is not None and len(whole.shape) >= 2:
            sides.append(whole.shape[:2])
        elif a is not None and b is not None and len(a.shape) == 2 and len(b.shape) >= 2 \
                and a.shape[1] == b.shape[0]:
            sides.append((a.shape[0], b.shape[1]))
            ranks.append(a.shape[1])
        else:
            raise WorkbenchError(f"{name}: LoKr's {w} is neither whole nor two factors that multiply")
    (a, b), (c, d) = sides
    if a * c != outputs or b * d != inputs or max(ranks) > min(inputs, outputs):
        raise WorkbenchError(f"{name}: LoKr factors make a ({a * c}, {b * d}) layer of rank {max(ranks)}, not "
                             f"({outputs}, {inputs}) of rank at most {min(inputs, outputs)}")
    return max(ranks)


def _check_group(suffixes: dict, inputs: int, outputs: int, weight: int, name: str) -> tuple[str, int]:
    """(kind, rank) of one layer's adapter tensors, each shape checked against the layer."""
    roles = {}
    for suffix, entry in suffixes.items():
        if math.prod(entry.shape) > weight:
            raise WorkbenchError(f"{name}: {suffix} of shape {entry.shape} is larger than the layer it adapts "
                                 f"({weight:,} weights)")
        role = ROLES[suffix]
        if role in roles and role in ("down", "up", "magnitude", "alpha"):
            raise WorkbenchError(f"{name}: holds two {role} tensors ({suffix} and another name for it)")
        roles.setdefault(role, entry)
    alpha = roles.get("alpha")
    if alpha is not None and math.prod(alpha.shape) != 1:
        raise WorkbenchError(f"{name}: alpha of shape {alpha.shape}, not one number")
    if "hada" in roles:
        for w in (1, 2):
            a, b = suffixes.get(f"hada_w{w}_a"), suffixes.get(f"hada_w{w}_b")
            fits = a is not None and b is not None and len(a.shape) == len(b.shape) == 2 and a.shape[0] == outputs \
                and b.shape[1] == inputs and a.shape[1] == b.shape[0] <= min(inputs, outputs)
            if not fits:
                raise WorkbenchError(f"{name}: LoHa factors that do not make a ({outputs}, {inputs}) layer")
        return "loha", suffixes["hada_w1_a"].shape[1]
    if "lokr" in roles:
        return "lokr", _check_lokr(suffixes, inputs, outputs, name)
    rank = _check_lora(roles, inputs, outputs, name)
    return ("dora" if "magnitude" in roles else "lora"), rank


def check_adapter_file(path: str | Path, denoiser: torch.nn.Module, family: str,
                       max_bytes: int = MAX_ADAPTER_BYTES, text_encoders: dict | None = None) -> AdapterFile:
    """The adapter file ``path`` judged against ``denoiser`` (of the family named ``family``) and the text encoders
    ``text_encoders`` (part name -> module; those an adapter may adapt) from its header alone; a one-line
    WorkbenchError naming the file and the problem where it may not be loaded."""
    path = Path(path)
    if path.suffix.lower() in PICKLES:
        raise WorkbenchError(f"{path}: a pickle file ({path.suffix}) is never opened (unpickling runs the code it "
                             "names); adapters are read from .safetensors only")
    if path.suffix.lower() != ".safetensors":
        raise WorkbenchError(f"{path}: adapters are read from .safetensors files only")
    problem = outside_root(path.parent, path.name)
    if problem:
        raise WorkbenchError(f"{path}: {problem}")
    size = path.stat().st_size
    if size > max_bytes:
        raise WorkbenchError(f"{path}: {size:,} bytes, over the limit of {max_bytes:,} for an adapter file")
    head = read_safetensors_head(path)
    if not head.tensors:
        raise WorkbenchError(f"{path}: holds no tensors")
    layers = adaptable_layers(denoiser, text_encoders)
    layout, groups = _group(head, denoiser, family_named(family), layers, path, tuple(text_encoders or ()))
    kinds, ranks = set(), []
    for paths, suffixes in groups.items():
        kind, rank = _check_group(suffixes, *_sizes(layers, paths), f"{path}: layer {paths[0]}")
        kinds.add(kind)
        ranks.append(rank)
    towers = sorted({p[0].partition(".")[0] for p in groups if is_text_encoder_key(p[0])})
    return AdapterFile(path, layout, "+".join(sorted(kinds)), max(ranks), sum(len(p) for p in groups),
                       sum(t.nbytes for t in head.tensors.values()), head.metadata, tuple(towers))
