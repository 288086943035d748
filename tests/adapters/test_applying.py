"""Adapter files applied to an opened pipeline (``models.adapters.apply_adapters``) and through `dwb sample --lora`:

- LoRA files written by diffusers itself (``save_lora_weights``; the kohya layout through its
  ``convert_state_dict_to_kohya``) draw what plain diffusers' ``load_lora_weights`` draws at the same strength, for
  SD 2.x, SDXL and Flux.1; two stacked draw what ``set_adapters`` with two weights draws;
- LoKr, LoHa, DoRA (and LoRA) files written from peft's own state dict (``get_peft_model_state_dict``, the peft
  layout: its alpha in the file's ``peft_config``) draw what their merge, written here from each format's formula,
  draws; a LyCORIS LoKr under kohya's names merges as its formula says;
- a LoRA in ComfyUI's layout, and one in kohya's fused Flux.1 names, draw what diffusers draws from the same weights;
- a file for another family, and one whose keys match nothing, are refused in one line naming the family."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from models.adapters import add_adapter, apply_adapters, kohya_hashes, parse_adapter_arg
from models.errors import WorkbenchError
from models.families import family_named

from .adapted import denoiser_of, draw, fresh, made_once, pipeline, randomize

ATOL = 1e-5  # measured: 0 in every case here (CPU, float32); each adapter moves some pixel by over 0.02
STRENGTH = 0.7


def _peft_state(denoiser):
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(denoiser).items()}


def _lora_state(family: str, denoiser, seed: int = 1) -> dict:
    """peft's state dict of a LoRA (the family's preset: rank 4, alpha 4) with seeded random weights."""
    add_adapter(denoiser, family)
    randomize(denoiser, seed=seed)
    return _peft_state(denoiser)


def _write_diffusers_lora(family: str, denoiser, folder, name: str, kohya: bool = False, seed: int = 1):
    """A LoRA (rank 4, alpha 4) with seeded random weights, written by diffusers' own ``save_lora_weights``; with
    ``kohya``, its state dict renamed by diffusers' ``convert_state_dict_to_kohya`` and saved as it is."""
    import diffusers
    from diffusers.utils import convert_state_dict_to_diffusers, convert_state_dict_to_kohya
    from safetensors.torch import save_file

    entry = family_named(family)
    state = _lora_state(family, denoiser, seed)
    path = folder / f"{name}.safetensors"
    if kohya:
        kohya_state = convert_state_dict_to_kohya({f"unet.{k}": v for k, v in state.items()})
        save_file({k: v.contiguous() for k, v in kohya_state.items()}, path)
        return path
    if entry.denoiser == "unet":
        state = convert_state_dict_to_diffusers(state)
    getattr(diffusers, entry.pipeline).save_lora_weights(folder, weight_name=path.name,
                                                         **{f"{entry.denoiser}_lora_layers": state})
    return path


@pytest.fixture(scope="module")
def bases(family_folders):
    """family -> (its tiny pipeline, a copy of its denoiser before any adapter, the image it draws)."""
    def make(family):
        pipe = pipeline(family, family_folders)
        return pipe, copy.deepcopy(denoiser_of(pipe, family)), draw(pipe, family)

    return made_once(make)


def _plain(pipe, family, base, files, strengths) -> np.ndarray:
    """What plain diffusers draws with ``files`` loaded into a fresh copy of the base at ``strengths``."""
    loaded = fresh(pipe, family, base)
    names = [f"plain_{i}" for i in range(len(files))]
    for name, path in zip(names, files):
        loaded.load_lora_weights(str(path), adapter_name=name)
    loaded.set_adapters(names, strengths)
    return draw(loaded, family)


def _ours(pipe, family, base, files, strengths) -> np.ndarray:
    applied = fresh(pipe, family, base)
    apply_adapters(applied, list(zip(files, strengths)))
    return draw(applied, family)


# SD 2.x's kohya file is the stacked test's second and `dwb sample`'s; SDXL's diffusers file is the ComfyUI test's
@pytest.mark.parametrize("family,kohya", [("sd2", False), ("sdxl", True), ("flux", False)])
def test_a_lora_written_by_diffusers_draws_what_plain_diffusers_draws_at_the_same_strength(
        family, kohya, bases, tmp_path):
    pipe, base, base_image = bases(family)
    path = _write_diffusers_lora(family, copy.deepcopy(base), tmp_path, "style", kohya=kohya)
    ours = _ours(pipe, family, base, [path], [STRENGTH])
    assert np.abs(ours - base_image).max() > 0.02, "the LoRA changed no pixel"
    np.testing.assert_allclose(ours, _plain(pipe, family, base, [path], [STRENGTH]), atol=ATOL)


# Black Forest Labs' names of a double block's layers, as ComfyUI's layout writes them (kohya's with dots)
BFL_LAYERS = {f"{stream}_{kohya}": f"{stream}_{bfl}" for stream in ("img", "txt") for kohya, bfl in
              (("attn_qkv", "attn.qkv"), ("attn_proj", "attn.proj"), ("mlp_0", "mlp.0"), ("mlp_2", "mlp.2"))}


def _as_comfyui_flux(path, out) -> None:
    """kohya's Flux.1 file renamed to ComfyUI's layout: ``diffusion_model.double_blocks.0.img_attn.qkv.lora_A``."""
    from safetensors.torch import load_file, save_file

    renamed = {}
    for key, tensor in load_file(str(path)).items():
        name, _, suffix = key.partition(".")
        block = name[len("lora_unet_double_blocks_"):]
        index, _, layer = block.partition("_")
        suffix = {"lora_down.weight": "lora_A.weight", "lora_up.weight": "lora_B.weight"}.get(suffix, suffix)
        renamed[f"diffusion_model.double_blocks.{index}.{BFL_LAYERS[layer]}.{suffix}"] = tensor
    save_file(renamed, out)


def test_a_flux_lora_in_kohyas_fused_names_and_comfyuis_draws_what_diffusers_kohya_converter_draws(bases, tmp_path):
    """kohya's Flux.1 layout (``write_adapter``'s: a block's q, k, v as one ``img_attn_qkv``), judged and read by
    diffusers' converter, and the same file in ComfyUI's names; on a double block (its single blocks' converter
    hard-codes the full width)."""
    from models.adapters import write_adapter
    from models.adapters.presets import FLUX_TARGETS

    pipe, base, base_image = bases("flux")
    adapted = copy.deepcopy(base)
    add_adapter(adapted, "flux", targets=[f"transformer_blocks.0.{t}" for t in FLUX_TARGETS])
    randomize(adapted)
    path = write_adapter(adapted, "flux", tmp_path / "flux-kohya.safetensors", layout="kohya")
    _as_comfyui_flux(path, tmp_path / "flux-comfyui.safetensors")
    plain = _plain(pipe, "flux", base, [path], [STRENGTH])
    assert np.abs(plain - base_image).max() > 0.02, "the LoRA changed no pixel"
    for written in (path, tmp_path / "flux-comfyui.safetensors"):
        np.testing.assert_allclose(_ours(pipe, "flux", base, [written], [STRENGTH]), plain, atol=ATOL,
                                   err_msg=written.name)


# the original SDXL UNet's names of the tiny SDXL's attention blocks (2 layers a block: input block 1 + 3b + j,
# output block 3b + j), as ComfyUI's layout names them
SDXL_ORIGINAL = {"down_blocks.1.attentions.0": "input_blocks.4.1", "down_blocks.1.attentions.1": "input_blocks.5.1",
                 "mid_block.attentions.0": "middle_block.1", "up_blocks.0.attentions.0": "output_blocks.0.1",
                 "up_blocks.0.attentions.1": "output_blocks.1.1", "up_blocks.0.attentions.2": "output_blocks.2.1"}


def test_an_sdxl_lora_from_diffusers_and_in_comfyuis_layout_draws_what_plain_diffusers_draws(bases, tmp_path):
    """One LoRA written by diffusers' ``save_lora_weights`` and the same weights in ComfyUI's layout: both draw, through
    ``apply_adapters``, what plain diffusers draws from the diffusers file."""
    import diffusers
    from diffusers.utils import convert_state_dict_to_diffusers
    from safetensors.torch import save_file

    pipe, base, base_image = bases("sdxl")
    state = _lora_state("sdxl", copy.deepcopy(base))
    comfyui = {}
    for key, tensor in state.items():
        block = next(b for b in SDXL_ORIGINAL if key.startswith(b + "."))
        comfyui["diffusion_model." + SDXL_ORIGINAL[block] + key[len(block):]] = tensor
    save_file(comfyui, tmp_path / "comfy.safetensors")
    diffusers.StableDiffusionXLPipeline.save_lora_weights(
        tmp_path, weight_name="same.safetensors", unet_lora_layers=convert_state_dict_to_diffusers(state))
    plain = _plain(pipe, "sdxl", base, [tmp_path / "same.safetensors"], [STRENGTH])
    assert np.abs(plain - base_image).max() > 0.02, "the LoRA changed no pixel"
    for written in ("same", "comfy"):
        ours = _ours(pipe, "sdxl", base, [tmp_path / f"{written}.safetensors"], [STRENGTH])
        np.testing.assert_allclose(ours, plain, atol=ATOL, err_msg=written)


def test_a_lokr_in_lycoris_names_merges_by_its_formula_with_alpha_only_on_a_factored_side(bases, tmp_path):
    """LyCORIS' LoKr under kohya's names: a side given whole takes no alpha (scale 1), a factored one alpha / rank."""
    from safetensors.torch import save_file

    pipe, base, _ = bases("sd2")
    gen = torch.Generator().manual_seed(3)
    layers = {"down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q": True,
              "up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_v": False}
    expected, tensors = copy.deepcopy(base), {}
    modules = dict(expected.named_modules())
    for module, factored in layers.items():
        weight = modules[module].weight
        name = "lora_unet_" + module.replace(".", "_")
        w1 = torch.randn(4, 4, generator=gen)
        out, inp = weight.shape[0] // 4, weight.shape[1] // 4
        if factored:
            w2_a, w2_b = torch.randn(out, 2, generator=gen), torch.randn(2, inp, generator=gen)
            tensors.update({f"{name}.lokr_w2_a": w2_a, f"{name}.lokr_w2_b": w2_b})
            w2, scale = w2_a @ w2_b, 6.0 / 2
        else:
            w2 = torch.randn(out, inp, generator=gen)
            tensors[f"{name}.lokr_w2"] = w2
            scale = 1.0
        tensors.update({f"{name}.lokr_w1": w1, f"{name}.alpha": torch.tensor(6.0)})
        with torch.no_grad():
            weight.add_(torch.kron(w1, w2) * scale * STRENGTH)
    save_file(tensors, tmp_path / "lokr.safetensors")
    applied = fresh(pipe, "sd2", base)
    (done,) = apply_adapters(applied, [(tmp_path / "lokr.safetensors", STRENGTH)])
    assert (done.kind, done.layout, done.merged) == ("lokr", "kohya", True)
    for module in layers:
        got, want = applied.unet.get_submodule(module).weight, modules[module].weight
        assert not torch.equal(want, base.get_submodule(module).weight)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_two_loras_stacked_draw_what_set_adapters_draws_with_two_weights(bases, tmp_path):
    pipe, base, base_image = bases("sd2")
    first = _write_diffusers_lora("sd2", copy.deepcopy(base), tmp_path, "first", seed=1)
    second = _write_diffusers_lora("sd2", copy.deepcopy(base), tmp_path, "second", kohya=True, seed=2)
    ours = _ours(pipe, "sd2", base, [first, second], [0.8, -0.5])
    assert np.abs(ours - base_image).max() > 0.02, "the LoRAs changed no pixel"
    np.testing.assert_allclose(ours, _plain(pipe, "sd2", base, [first, second], [0.8, -0.5]), atol=ATOL)


def _independent_merge(denoiser, kind: str, state: dict, config, strength: float) -> None:
    """Each adapted layer's weight replaced by the format's formula, from peft's state dict and config alone."""
    layers = dict(denoiser.named_modules())
    modules = {k.rsplit(".", 2 if k.endswith(".weight") else 1)[0] for k in state}
    with torch.no_grad():
        for module in modules:
            t = {k[len(module) + 1:]: v.float() for k, v in state.items() if k.startswith(module + ".")}
            weight = layers[module].weight
            w = weight.float()
            if kind == "loha":
                scale = config.alpha / config.r
                delta = (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"]) * scale
            elif kind == "lokr":
                w1 = t["lokr_w1"] if "lokr_w1" in t else t["lokr_w1_a"] @ t["lokr_w1_b"]
                w2 = t["lokr_w2"] if "lokr_w2" in t else t["lokr_w2_a"] @ t["lokr_w2_b"]
                delta = torch.kron(w1, w2) * (config.alpha / config.r)
            else:
                delta = t["lora_B.weight"] @ t["lora_A.weight"] * (config.lora_alpha / config.r)
            adapted = w + strength * delta
            if kind == "dora":
                adapted = t["lora_magnitude_vector"][:, None] * adapted / adapted.norm(dim=1, keepdim=True)
            weight.copy_(adapted)


@pytest.mark.parametrize("kind", ["lokr", "loha", "dora", "lora"])
def test_a_peft_file_of_each_kind_draws_what_its_merge_by_the_formula_draws(kind, bases, tmp_path):
    from models.adapters import write_adapter

    pipe, base, base_image = bases("sd2")
    adapted = copy.deepcopy(base)
    config = add_adapter(adapted, "sd2", kind=kind, alpha=8)
    randomize(adapted)
    state = _peft_state(adapted)
    path = write_adapter(adapted, "sd2", tmp_path / f"{kind}.safetensors", layout="peft")
    assert json.loads(_metadata(path)["peft_config"])["peft_type"]  # peft's config travels with the file
    ours = _ours(pipe, "sd2", base, [path], [STRENGTH])
    merged = copy.deepcopy(base)
    _independent_merge(merged, kind, state, config, STRENGTH)
    expected = draw(fresh(pipe, "sd2", merged), "sd2")
    assert np.abs(expected - base_image).max() > 0.02, f"the {kind} changed no pixel"
    np.testing.assert_allclose(ours, expected, atol=ATOL)


def _metadata(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def test_a_file_for_another_family_is_refused_in_one_line_naming_that_family(bases, tmp_path):
    pipe, base, _ = bases("sd2")
    sdxl_pipe, sdxl_base, _ = bases("sdxl")
    path = _write_diffusers_lora("sdxl", copy.deepcopy(sdxl_base), tmp_path, "for-sdxl")
    with pytest.raises(WorkbenchError) as refused:
        apply_adapters(fresh(pipe, "sd2", base), [(path, 1.0)])
    message = str(refused.value)
    assert "\n" not in message and "an adapter for Stable Diffusion XL, not " in message, message


def test_a_file_whose_keys_match_nothing_is_refused_in_one_line_naming_the_family(bases, tmp_path):
    from safetensors.torch import save_file

    pipe, base, _ = bases("sd2")
    path = tmp_path / "nothing.safetensors"
    save_file({"unet.no_such_block.proj.lora_A.weight": torch.zeros(4, 8),
               "unet.no_such_block.proj.lora_B.weight": torch.zeros(8, 4)}, path)
    with pytest.raises(WorkbenchError) as refused:
        apply_adapters(fresh(pipe, "sd2", base), [(path, 1.0)])
    message, label = str(refused.value), family_named("sd2").label
    assert "\n" not in message and f"match no layer of {label}'s UNet2DConditionModel" in message, message


def test_dwb_sample_lora_draws_what_plain_diffusers_draws_and_records_the_lora_hash(bases, tmp_path):
    from PIL import Image

    from dwb import main
    from models.checkpoints import load_pipeline
    from models.generation import DEFAULT_SAMPLER, Settings, generate_images, parse_parameters

    pipe, base, base_image = bases("sd2")
    folder = tmp_path / "base"
    pipe.save_pretrained(folder)
    path = _write_diffusers_lora("sd2", copy.deepcopy(base), tmp_path, "my style", kohya=True)
    out = tmp_path / "grid.png"
    main(["sample", str(folder), str(out), "--prompt", "a red circle", "--seeds", "1", "--seed", "3",
          "--steps", "2", "--size", "32", "--guidance", "5", "--sampler", DEFAULT_SAMPLER,
          "--lora", f"{path}:{STRENGTH}", "--per-image"])
    drawn = np.asarray(Image.open(tmp_path / "grid" / "00000-3.png").convert("RGB"))
    plain = load_pipeline(str(folder))
    plain.load_lora_weights(str(path), adapter_name="plain")
    plain.set_adapters(["plain"], [STRENGTH])
    settings = Settings(steps=2, guidance=5.0, width=32, height=32, sampler=DEFAULT_SAMPLER)
    expected = generate_images(plain, ["a red circle"], [3], settings)[0]
    np.testing.assert_array_equal(drawn, expected)
    parameters = Image.open(out).info["parameters"]
    short = kohya_hashes(path.read_bytes())[0][:12]
    assert parse_parameters(parameters)["Lora hashes"] == f"my style: {short}", parameters
    assert parameters.splitlines()[0] == "a red circle"  # no <lora:...> tag added to the prompt


def test_a_strength_is_read_from_the_file_argument_and_bounded():
    assert parse_adapter_arg("a/b.safetensors:0.8") == (__import__("pathlib").Path("a/b.safetensors"), 0.8)
    assert parse_adapter_arg("C:/x.safetensors")[1] == 1.0
    with pytest.raises(WorkbenchError, match="outside"):
        parse_adapter_arg("x.safetensors:40")
