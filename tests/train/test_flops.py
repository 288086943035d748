"""`train.flops`: a training batch's FLOPs, attention included on a CPU, where PyTorch's ``FlopCounterMode`` has no
formula for the fused kernel and counted its attention as 0."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from train.config import load_config
from train.flops import count_batch, flop_counter

from ..conftest import REPO, tiny_overrides

CPU_ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu"


def counted(counter, step) -> dict[str, int]:
    """FLOPs per op of ``step`` (forward and backward) under ``counter``."""
    with counter:
        step()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_fused_attention_on_a_cpu_counts_as_attention_written_out_with_matmuls():
    """Cross-attention (8 queries over 24 keys, heads 16 wide): the fused CPU kernel's forward and backward
    count what plain ``FlopCounterMode`` counts for the same attention written as two matmuls and a softmax."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 8, 16, generator=generator, requires_grad=True)
    k, v = (torch.randn(2, 3, 24, 16, generator=generator, requires_grad=True) for _ in range(2))

    def fused():
        F.scaled_dot_product_attention(q, k, v).square().sum().backward()

    def written_out():
        weights = (q @ k.transpose(-1, -2) / 4).softmax(-1)
        (weights @ v).square().sum().backward()

    ours, theirs = counted(flop_counter(), fused), counted(FlopCounterMode(display=False), written_out)
    assert ours.get(CPU_ATTENTION, 0) > 0 and "aten.bmm" not in ours  # the fused kernel ran, and was counted
    assert sum(ours.values()) == sum(theirs.values()) == theirs["aten.bmm"]


@pytest.mark.parametrize("config", ["tiny-mmdit-phase2.yaml", "tiny-phase2.yaml"])
def test_a_training_batch_counts_its_attention_as_the_matmul_path_does(config, shapes_data, components):
    """One batch of the tiny MMDiT (joint attention over text and image tokens) and of the tiny UNet (self- and
    cross-attention), counted as `dwb demo` counts it, equals the count of the same batch with every attention
    computed by PyTorch's math path (matmuls, which ``FlopCounterMode`` counts itself)."""
    cfg = load_config(REPO / "configs" / config, tiny_overrides(shapes_data, components, Path("unused"), res=32,
                                                                global_train_batch_size=2,
                                                                device_train_microbatch_size=2))
    fused = {str(op): n for op, n in count_batch(cfg).get_flop_counts()["Global"].items()}
    with sdpa_kernel(SDPBackend.MATH):
        math = {str(op): n for op, n in count_batch(cfg).get_flop_counts()["Global"].items()}
    assert fused.get(CPU_ATTENTION, 0) > 0 and fused.get(CPU_ATTENTION + "_backward", 0) > 0, fused
    assert CPU_ATTENTION not in math and math.get("aten.bmm", 0) > 0, math
    assert sum(fused.values()) == sum(math.values())
