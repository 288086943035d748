"""The kohya layout beyond the images (test_files_load_everywhere.py draws them): kohya's metadata and the hashes
AUTOMATIC1111 reads, and Flux.1's fused single-block layer at full width, split back by diffusers' own converter."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save

from models.adapters import add_adapter, write_adapter
from models.adapters.kohya import kohya_tensors


def _automatic1111_read(path):
    """What AUTOMATIC1111's Lora extension takes from a LoRA file, as extensions-builtin/Lora/network.py and
    modules/hashes.py read it: the header's ``__metadata__``; the version (``detect_version``: ``ss_base_model_version``
    starting with ``sdxl_`` is SDXL, ``ss_v2`` "True" is SD 2, any other metadata SD 1); and the hash it computes of
    the file (``addnet_hash_safetensors``: the sha256 of the bytes after the header)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8:8 + length]).get("__metadata__", {})
    if str(metadata.get("ss_base_model_version", "")).startswith("sdxl_"):
        version = "SDXL"
    elif str(metadata.get("ss_v2", "")) == "True":
        version = "SD2"
    else:
        version = "SD1" if metadata else "Unknown"
    return metadata, version, hashlib.sha256(data[8 + length:]).hexdigest()


@pytest.fixture(scope="module")
def wide_unet():
    """A UNet whose cross-attention takes 4096 wide states, so a rank-32 LoRA on its key and value projections
    fills past 1 MiB: kohya's legacy hash reads the 64 KiB at 1 MiB, and of a smaller file hashes nothing."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(sample_size=8, block_out_channels=(32, 64), layers_per_block=1,
                                cross_attention_dim=4096, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=8)
    add_adapter(unet, "sd2", rank=32, alpha=16, targets=["attn2.to_k", "attn2.to_v"])
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "lora_" in name:
                p.normal_()
    return unet


@pytest.mark.parametrize("family, version", [("sd1", "SD1"), ("sd2", "SD2"), ("sdxl", "SDXL")])
def test_kohya_metadata_and_hashes_read_as_automatic1111_reads_them(wide_unet, family, version, tmp_path):
    path = write_adapter(wide_unet, family, tmp_path / f"{family}.safetensors", layout="kohya",
                         metadata={"ss_training_comment": "tiny"})
    metadata, read_version, file_hash = _automatic1111_read(path)
    assert read_version == version
    assert (metadata["ss_network_dim"], metadata["ss_network_alpha"]) == ("32", "16.0")
    assert metadata["ss_network_module"] == "networks.lora" and metadata["ss_output_name"] == family
    assert metadata["sshs_model_hash"] == file_hash
    # kohya's legacy hash: the 64 KiB at 1 MiB of the file as saved with its ss_* metadata alone
    tensors = load_file(path)
    ss_only = save(tensors, {k: v for k, v in metadata.items() if k.startswith("ss_")})
    assert len(ss_only) > 0x110000
    assert metadata["sshs_legacy_hash"] == hashlib.sha256(ss_only[0x100000:0x110000]).hexdigest()[:8]


def test_a_full_width_flux_single_block_is_split_back_by_diffusers_converter(tmp_path):
    """A single block's query, key and value LoRAs at Flux.1's width (3072) become kohya's ``linear1`` with the
    MLP's 12288 outputs beside them; diffusers' converter (which takes those widths as given) returns each LoRA's
    product as it was, and none for the MLP."""
    from diffusers import FluxPipeline

    gen = torch.Generator().manual_seed(0)
    block = "single_transformer_blocks.0"
    loras = {f"{block}.attn.{p}": (torch.randn(4, 3072, generator=gen), torch.randn(3072, 4, generator=gen), 0.5)
             for p in ("to_q", "to_k", "to_v")}
    modules = {f"{block}.proj_mlp": torch.nn.Linear(3072, 12288, device="meta")}
    tensors = kohya_tensors(loras, modules, "flux")
    assert set(tensors) == {f"lora_unet_single_blocks_0_linear1.{s}" for s in ("lora_down.weight", "lora_up.weight",
                                                                                "alpha")}
    path = tmp_path / "linear1.safetensors"
    path.write_bytes(save(tensors))
    converted = FluxPipeline.lora_state_dict(path)
    for name, (down, up, scale) in loras.items():
        a, b = converted[f"transformer.{name}.lora_A.weight"], converted[f"transformer.{name}.lora_B.weight"]
        torch.testing.assert_close(b @ a, up @ down * scale, rtol=1e-5, atol=1e-4)
    mlp = f"transformer.{block}.proj_mlp"
    mlp = converted[f"{mlp}.lora_B.weight"] @ converted[f"{mlp}.lora_A.weight"]
    assert mlp.shape == (12288, 3072) and not mlp.any()
