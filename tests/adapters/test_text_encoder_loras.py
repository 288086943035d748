"""Adapter files that also adapt the text encoders (most kohya LoRAs for SD 1.x and SDXL do), applied through
``models.adapters.apply_adapters``:

- a LoRA on the UNet and the text encoder(s), written by diffusers and peft themselves (peft's ``LoraConfig`` on the
  CLIP towers, ``save_lora_weights(unet_lora_layers=..., text_encoder_lora_layers=...)``, and diffusers'
  ``convert_state_dict_to_kohya`` for the kohya layout), draws what plain diffusers' ``load_lora_weights`` draws at
  the same strength, for SD 2.x, SDXL (both towers) and Flux.1 (CLIP-L), and each tower's states move;
- a LoHa under LyCORIS' kohya names on the text encoder merges by its formula;
- keys of a text encoder the family does not have (``lora_te2_``, ``text_encoder_2.`` on SD 2.x) are refused in one
  line naming the family."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models.adapters import add_adapter, apply_adapters
from models.errors import WorkbenchError
from models.families import family_named

from .adapted import PROMPT, draw, made_once, pipeline, randomize

STRENGTH = 0.7
ATOL = 1e-5  # both routes end in diffusers' own loader: Flux.1's differed by 0.0 (CPU, float32) when measured
# the towers each test LoRA adapts: every CLIP tower (Flux.1's T5 takes none: diffusers' loader adapts no T5)
TOWERS = {"sd2": ("text_encoder",), "sdxl": ("text_encoder", "text_encoder_2"), "flux": ("text_encoder",)}
TOKENIZERS = {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2"}


@pytest.fixture(scope="module")
def bases(family_folders):
    """family -> (its tiny pipeline, copies of its denoiser and text encoders before any adapter)."""
    def make(family):
        pipe = pipeline(family, family_folders)
        return pipe, {p: copy.deepcopy(getattr(pipe, p)) for p in (family_named(family).denoiser, *TOWERS[family])}

    return made_once(make)


def _fresh(pipe, parts: dict):
    """The same pipeline around copies of the denoiser and text encoders as they were before any adapter."""
    return type(pipe)(**{**pipe.components, **{name: copy.deepcopy(m) for name, m in parts.items()}})


def _text_states(pipe, towers) -> dict[str, torch.Tensor]:
    """Each of the text encoders ``towers``' last hidden states of the prompt."""
    states = {}
    with torch.no_grad():
        for tower in towers:
            ids = getattr(pipe, TOKENIZERS[tower])(PROMPT, return_tensors="pt").input_ids
            states[tower] = getattr(pipe, tower)(ids)[0]
    return states


def _peft_lora(module, targets, seed: int) -> dict:
    """peft's state dict of a rank-4 LoRA (alpha 4, as diffusers' training scripts set it) on ``module``, its
    weights seeded random (peft starts the up weights at zero)."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    module.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=targets))
    randomize(module, seed=seed)
    return {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(module).items()}


def _write(family: str, parts: dict, folder):
    """One LoRA on the UNet and every text encoder of ``parts`` (CLIP's attention projections, as diffusers'
    ``train_dreambooth_lora_sdxl.py`` targets them), written by diffusers' ``save_lora_weights`` and renamed by its
    ``convert_state_dict_to_kohya`` (alpha = rank: the same scale): (the diffusers file, the kohya file)."""
    import diffusers
    from diffusers.utils import convert_state_dict_to_diffusers, convert_state_dict_to_kohya
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    parts = {name: copy.deepcopy(m) for name, m in parts.items()}
    add_adapter(parts["unet"], family)
    randomize(parts["unet"], seed=1)
    states = {"unet": {k: v.detach().clone() for k, v in get_peft_model_state_dict(parts["unet"]).items()}}
    for i, tower in enumerate(TOWERS[family]):
        states[tower] = _peft_lora(parts[tower], ["q_proj", "k_proj", "v_proj", "out_proj"], seed=2 + i)
    written = folder / f"{family}-diffusers.safetensors"
    getattr(diffusers, family_named(family).pipeline).save_lora_weights(
        folder, weight_name=written.name,
        **{f"{p}_lora_layers": convert_state_dict_to_diffusers(s) for p, s in states.items()})
    kohya = convert_state_dict_to_kohya({f"{p}.{k}": v for p, s in states.items() for k, v in s.items()})
    save_file({k: v.contiguous() for k, v in kohya.items()}, folder / f"{family}-kohya.safetensors")
    return written, folder / f"{family}-kohya.safetensors"


def _assert_draws_what_plain_diffusers_draws(family: str, bases, files) -> None:
    """Each of ``files`` (a diffusers file first, the others the same weights in the kohya layout), through
    ``apply_adapters`` at 0.7, gives each adapted tower's states and draws the image plain diffusers'
    ``load_lora_weights`` of the diffusers file gives at 0.7; each tower's states moved from the base's, so what is
    compared is adapted (the base's own image is not drawn: a draw fewer for the suite's time)."""
    pipe, parts = bases(family)
    plain = _fresh(pipe, parts)
    plain.load_lora_weights(str(files[0]), adapter_name="plain")
    plain.set_adapters(["plain"], [STRENGTH])
    towers = TOWERS[family]
    base_states, plain_states, plain_image = _text_states(pipe, towers), _text_states(plain, towers), \
        draw(plain, family)
    for path, layout in zip(files, ("diffusers", "kohya")):
        ours = _fresh(pipe, parts)
        (applied,) = apply_adapters(ours, [(path, STRENGTH)])
        assert (applied.layout, applied.merged) == (layout, False)
        our_states = _text_states(ours, towers)
        for tower in towers:
            assert (our_states[tower] - base_states[tower]).abs().max() > 0.02, f"{tower} was not adapted"
            torch.testing.assert_close(our_states[tower], plain_states[tower], atol=ATOL, rtol=0, msg=layout)
        np.testing.assert_allclose(draw(ours, family), plain_image, atol=ATOL, err_msg=layout)


@pytest.mark.parametrize("family", ["sd2", "sdxl"])
def test_a_lora_on_the_unet_and_text_encoders_draws_what_plain_diffusers_draws_at_the_same_strength(
        family, bases, tmp_path):
    """The diffusers file and its kohya renaming (``lora_te1_``, and SDXL's ``lora_te2_``)."""
    _assert_draws_what_plain_diffusers_draws(family, bases, _write(family, bases(family)[1], tmp_path))


def test_a_flux_lora_on_the_transformer_and_clip_l_draws_what_plain_diffusers_draws(bases, tmp_path):
    """Flux.1: a LoRA on a double block and on CLIP-L, written by ``save_lora_weights``, and in kohya's layout:
    ``write_adapter``'s fused ``img_attn_qkv`` names (diffusers' ``convert_state_dict_to_kohya`` writes no fused
    layer) beside ``convert_state_dict_to_kohya``'s ``lora_te1_`` keys of CLIP-L, as kohya's ``lora_flux.py`` names
    them; on a double block (the converter of a single block hard-codes the full width)."""
    import diffusers
    from diffusers.utils import convert_state_dict_to_kohya
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file, save_file

    from models.adapters import write_adapter
    from models.adapters.presets import FLUX_TARGETS

    _, parts = bases("flux")
    transformer, clip = copy.deepcopy(parts["transformer"]), copy.deepcopy(parts["text_encoder"])
    add_adapter(transformer, "flux", targets=[f"transformer_blocks.0.{t}" for t in FLUX_TARGETS])
    randomize(transformer)
    clip_state = _peft_lora(clip, ["q_proj", "k_proj", "v_proj", "out_proj"], seed=2)
    diffusers.FluxPipeline.save_lora_weights(tmp_path, weight_name="flux.safetensors",
                                             transformer_lora_layers=get_peft_model_state_dict(transformer),
                                             text_encoder_lora_layers=clip_state)
    kohya = tmp_path / "flux-kohya.safetensors"
    tensors = load_file(str(write_adapter(transformer, "flux", kohya, layout="kohya")))
    tensors.update(convert_state_dict_to_kohya({f"text_encoder.{k}": v for k, v in clip_state.items()}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, kohya)
    assert any(k.startswith("lora_te1_") for k in tensors) and any("img_attn_qkv" in k for k in tensors)
    _assert_draws_what_plain_diffusers_draws("flux", bases, [tmp_path / "flux.safetensors", kohya])


def test_a_loha_in_lycoris_names_on_the_text_encoder_merges_by_its_formula(bases, tmp_path):
    """LyCORIS' LoHa under kohya's text-encoder names (``lora_te_text_model_encoder_layers_0_self_attn_q_proj``),
    which plain diffusers cannot read: each weight gains ``(w1_a @ w1_b) * (w2_a @ w2_b) * alpha / rank`` times the
    strength."""
    from safetensors.torch import save_file

    pipe, parts = bases("sd2")
    gen = torch.Generator().manual_seed(5)
    expected, tensors = copy.deepcopy(parts["text_encoder"]), {}
    for module in ("text_model.encoder.layers.0.self_attn.q_proj", "text_model.encoder.layers.1.mlp.fc1"):
        weight = expected.get_submodule(module).weight
        out, inp = weight.shape
        name = "lora_te_" + module.replace(".", "_")
        factors = {f"hada_w{i}_{ab}": torch.randn(*((out, 2) if ab == "a" else (2, inp)), generator=gen) * 0.3
                   for i in (1, 2) for ab in "ab"}
        tensors.update({f"{name}.{k}": v for k, v in factors.items()})
        tensors[f"{name}.alpha"] = torch.tensor(3.0)
        with torch.no_grad():
            weight.add_((factors["hada_w1_a"] @ factors["hada_w1_b"]) * (factors["hada_w2_a"] @ factors["hada_w2_b"])
                        * (3.0 / 2) * STRENGTH)
    save_file(tensors, tmp_path / "loha-te.safetensors")
    applied = _fresh(pipe, parts)
    (done,) = apply_adapters(applied, [(tmp_path / "loha-te.safetensors", STRENGTH)])
    assert (done.kind, done.layout, done.merged) == ("loha", "kohya", True)
    got, want = dict(applied.text_encoder.named_parameters()), dict(expected.named_parameters())
    base = dict(parts["text_encoder"].named_parameters())
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-6, msg=name)
    assert not torch.equal(want["text_model.encoder.layers.1.mlp.fc1.weight"],
                           base["text_model.encoder.layers.1.mlp.fc1.weight"])


@pytest.mark.parametrize("key", ["lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight",
                                 "text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight"])
def test_keys_of_a_text_encoder_the_family_lacks_are_refused_in_one_line_naming_the_family(key, bases, tmp_path):
    """SD 2.x has one text encoder: kohya's ``lora_te2_`` (SDXL's second) and diffusers' ``text_encoder_2.`` name
    none of its towers, beside a UNet key and a first-tower key that fit."""
    from safetensors.torch import save_file

    pipe, parts = bases("sd2")
    kohya = key.startswith("lora_")
    unet_key = ("lora_unet_down_blocks_0_attentions_0_proj_in" if kohya
                else "unet.down_blocks.0.attentions.0.proj_in")
    te_key = ("lora_te_text_model_encoder_layers_0_self_attn_k_proj" if kohya
              else "text_encoder.text_model.encoder.layers.0.self_attn.k_proj")
    down, up = ("lora_down", "lora_up") if kohya else ("lora_A", "lora_B")
    save_file({f"{unet_key}.{down}.weight": torch.zeros(4, 32), f"{unet_key}.{up}.weight": torch.zeros(32, 4),
               f"{te_key}.{down}.weight": torch.zeros(4, 64), f"{te_key}.{up}.weight": torch.zeros(64, 4),
               key: torch.zeros(4, 64), key.replace(down, up): torch.zeros(64, 4)}, tmp_path / "te2.safetensors")
    with pytest.raises(WorkbenchError) as refused:
        apply_adapters(_fresh(pipe, parts), [(tmp_path / "te2.safetensors", 1.0)])
    message = str(refused.value)
    assert "\n" not in message and "adapts a text encoder Stable Diffusion 2.x does not have" in message, message
    assert key[:30] in message, message
