"""An adapter file from elsewhere never runs code, exhausts memory or reads outside its folder: each attack, built
on a real file that ``write_adapter`` wrote of a peft LoRA, is refused by ``check_adapter_file`` in one line that
names the file, from the header alone."""
from __future__ import annotations

import copy
import json
import os
import pickle
import re

import pytest
import torch
from safetensors.torch import load_file, save

from models.adapters import add_adapter, check_adapter_file, write_adapter
from models.errors import WorkbenchError

from .adapted import randomize, tiny_unet

TO_Q = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"  # a 32 x 32 Linear of the tiny UNet


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """(the base UNet, the folder, its diffusers-layout and kohya-layout files of a rank-4 LoRA)."""
    folder = tmp_path_factory.mktemp("adapters")
    unet = tiny_unet()
    base = copy.deepcopy(unet)
    add_adapter(unet, "sd2")
    randomize(unet)
    return (base, folder, write_adapter(unet, "sd2", folder / "style.safetensors"),
            write_adapter(unet, "sd2", folder / "style-kohya.safetensors", layout="kohya"))


def _refused(path, base, pattern: str, **options) -> str:
    with pytest.raises(WorkbenchError) as refused:
        check_adapter_file(path, base, "sd2", **options)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and re.search(pattern, message), message
    return message


def _raw(path, header, data: bytes = b""):
    """A file in the safetensors format with any header: 8 bytes of its length, the header, the data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def _edited(setting, name: str, change) -> object:
    """The diffusers-layout file with ``change`` applied to its tensors, saved as ``name``."""
    base, folder, diffusers_file, _ = setting
    tensors = load_file(diffusers_file)
    change(tensors)
    path = folder / name
    path.write_bytes(save(tensors))
    return path


def test_the_files_write_adapter_writes_pass_with_what_they_hold(setting):
    base, _, diffusers_file, kohya_file = setting
    for path, layout in ((diffusers_file, "diffusers"), (kohya_file, "kohya")):
        info = check_adapter_file(path, base, "sd2")
        assert (info.layout, info.kind, info.rank) == (layout, "lora", 4)
        assert info.layers == sum(n.endswith((".to_q", ".to_k", ".to_v", ".to_out.0")) for n, _ in
                                  base.named_modules())


@pytest.mark.parametrize("suffix", [".pt", ".ckpt", ".bin"])
def test_a_pickled_adapter_is_refused_and_never_unpickled(setting, suffix, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # unpickling this creates the marker file

    path = tmp_path / f"style{suffix}"
    path.write_bytes(pickle.dumps({"lora_unet_x.lora_down.weight": Payload()}))
    _refused(path, setting[0], r"pickle .*never opened")
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # the payload is live: unpickled, it runs
    assert marker.exists()


def test_a_link_named_like_an_adapter_is_refused_wherever_it_leads(setting, tmp_path):
    link = tmp_path / "style.safetensors"
    link.symlink_to(setting[2])  # a valid adapter, outside this folder
    _refused(link, setting[0], "symbolic link")


def test_a_header_longer_than_the_file_is_refused(setting, tmp_path):
    path = tmp_path / "long.safetensors"
    path.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    _refused(path, setting[0], r"not a safetensors file \(a header of 4,611,686,018,427,387,904 bytes")


def test_a_header_nested_thousands_deep_is_refused(setting, tmp_path):
    _refused(_raw(tmp_path / "deep.safetensors", b"[" * 5000 + b"]" * 5000), setting[0], "nested deeper")


def test_a_tensor_of_a_trillion_elements_in_a_small_file_is_refused(setting, tmp_path):
    header = {"unet.x.lora_A.weight": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}}
    _refused(_raw(tmp_path / "huge.safetensors", header, b"\0" * 16), setting[0], "outside the 16 bytes")


def test_a_shape_that_disagrees_with_its_bytes_is_refused(setting, tmp_path):
    header = {"unet.x.lora_A.weight": {"dtype": "F32", "shape": [4, 32], "data_offsets": [0, 16]}}
    _refused(_raw(tmp_path / "short.safetensors", header, b"\0" * 16), setting[0], r"\(512 bytes\) but holds 16")


def test_tensors_that_share_bytes_are_refused(setting, tmp_path):
    header = {f"unet.{TO_Q}.lora_A.weight": {"dtype": "F32", "shape": [4, 32], "data_offsets": [0, 512]},
              f"unet.{TO_Q}.lora_B.weight": {"dtype": "F32", "shape": [32, 4], "data_offsets": [256, 768]}}
    _refused(_raw(tmp_path / "shared.safetensors", header, b"\0" * 768), setting[0], "share bytes")


def test_a_file_over_the_size_limit_is_refused_before_its_header_is_read(setting, tmp_path):
    path = tmp_path / "sparse.safetensors"  # 5 GiB that take no disk: what a declared rank of 40 million needs
    header = {f"unet.{TO_Q}.lora_A.weight": {"dtype": "F32", "shape": [40_000_000, 32],
                                             "data_offsets": [0, 5_120_000_000]}}
    _raw(path, header)
    os.truncate(path, path.stat().st_size + 5_120_000_000)
    _refused(path, setting[0], r"over the limit of 4,294,967,296")
    _refused(setting[2], setting[0], "over the limit of 1,000", max_bytes=1000)


@pytest.mark.parametrize("rank", [33, 4096])
def test_a_rank_above_the_layers_full_rank_is_refused(setting, rank):
    """Above its layer's full rank (32 here) a LoRA's down or up weight holds more numbers than the layer itself:
    the header says so before any is read."""
    def bomb(tensors):
        tensors[f"unet.{TO_Q}.lora.down.weight"] = torch.zeros(rank, 32)
        tensors[f"unet.{TO_Q}.lora.up.weight"] = torch.zeros(32, rank)

    _refused(_edited(setting, f"rank{rank}.safetensors", bomb), setting[0],
             rf"lora.down.weight of shape \({rank}, 32\) is larger than the layer it adapts \(1,024 weights\)")


@pytest.mark.parametrize("key", ["unet.down_blocks.9.attentions.0.proj_in.lora_A.weight",  # no such block
                                 "unet.conv_norm_out.lora_A.weight",  # a GroupNorm: no adapter's layer
                                 "transformer.proj_out.lora_A.weight",  # another family's denoiser
                                 "lora_unet_mid_block_attentions_7_proj_in.lora_down.weight"])
def test_a_key_outside_the_denoiser_is_refused(setting, key):
    path = _edited(setting, "outside.safetensors", lambda t: t.update({key: torch.zeros(4, 32)}))
    _refused(path, setting[0], "names no layer of the UNet2DConditionModel")


TE_Q = "text_model.encoder.layers.0.self_attn.q_proj"  # a 32 x 32 Linear of the tiny text encoder


@pytest.fixture(scope="module")
def towers():
    """The text encoders a pipeline would give beside the UNet: a tiny CLIP text tower (32 wide, 2 layers)."""
    from ..family_fixtures import _clip

    return {"text_encoder": _clip()}


def _with_text_lora(setting, name: str, module: str, down, up, kohya: bool = False):
    """The diffusers-layout file (or the kohya one) with a LoRA on ``module`` of the text encoder added."""
    if kohya:
        base, folder, _, kohya_file = setting
        tensors = load_file(kohya_file)
        tensors.update({f"{module}.lora_down.weight": down, f"{module}.lora_up.weight": up})
        path = folder / name
        path.write_bytes(save(tensors))
        return path
    return _edited(setting, name, lambda t: t.update({f"text_encoder.{module}.lora_A.weight": down,
                                                      f"text_encoder.{module}.lora_B.weight": up}))


def test_text_encoder_keys_are_judged_against_the_text_encoders_given(setting, towers):
    """diffusers' ``text_encoder.`` names and kohya's (sd-scripts' ``lora_te_`` for SD 1/2's one tower, diffusers'
    converter's ``lora_te1_``) pass against the tower; without the tower given, they are refused."""
    kohya_name = TE_Q.replace(".", "_")
    for name, module, kohya in (("te.safetensors", TE_Q, False), ("te-kohya.safetensors", f"lora_te_{kohya_name}",
                                True), ("te1-kohya.safetensors", f"lora_te1_{kohya_name}", True)):
        path = _with_text_lora(setting, name, module, torch.zeros(4, 32), torch.zeros(32, 4), kohya)
        info = check_adapter_file(path, setting[0], "sd2", text_encoders=towers)
        assert (info.text_encoders, info.rank, info.layout) == (("text_encoder",), 4, "kohya" if kohya else "diffusers")
        _refused(path, setting[0], "adapts Stable Diffusion 2.x's text_encoder, which takes no adapter here")


@pytest.mark.parametrize("module,down,up,pattern", [
    ("text_model.encoder.layers.9.self_attn.q_proj", (4, 32), (32, 4),  # no such layer
     "names no layer of Stable Diffusion 2.x's text_encoder"),
    (TE_Q, (4, 32), (64, 4), r"up weight of shape \(64, 4\), not \(32, 4\)"),  # another width
    (TE_Q, (4096, 32), (32, 4096),  # a rank bomb
     r"lora_A.weight of shape \(4096, 32\) is larger than the layer it adapts \(1,024 weights\)")])
def test_a_hostile_text_encoder_key_is_refused(setting, towers, module, down, up, pattern):
    path = _with_text_lora(setting, "te-bad.safetensors", module, torch.zeros(down), torch.zeros(up))
    _refused(path, setting[0], pattern, text_encoders=towers)


def test_an_up_weight_of_another_width_is_refused(setting):
    path = _edited(setting, "wide.safetensors", lambda t: t.update({f"unet.{TO_Q}.lora.up.weight": torch.zeros(64, 4)}))
    _refused(path, setting[0], r"up weight of shape \(64, 4\), not \(32, 4\)")


def test_a_weight_without_its_pair_is_refused(setting):
    path = _edited(setting, "half.safetensors", lambda t: t.pop(f"unet.{TO_Q}.lora.up.weight"))
    _refused(path, setting[0], "a down weight without its pair")


def test_an_integer_tensor_is_refused(setting):
    path = _edited(setting, "int.safetensors",
                   lambda t: t.update({f"unet.{TO_Q}.lora.up.weight": torch.zeros(32, 4, dtype=torch.int64)}))
    _refused(path, setting[0], "is I64, not floating point")


def test_a_key_no_adapter_writes_is_refused(setting):
    path = _edited(setting, "bias.safetensors", lambda t: t.update({f"unet.{TO_Q}.bias": torch.zeros(32)}))
    _refused(path, setting[0], "no suffix any adapter kind writes")
