"""On a GPU: bf16 (or fp16) pipelines with PyTorch SDPA attention, and memory handed back on eviction."""
import gc

import numpy as np
import pytest
import torch

from app.generate import GenerationParams
from app.service import Runtime, Service

pytestmark = pytest.mark.gpu


def test_gpu_pipelines_run_in_half_precision_with_sdpa(tree):
    from diffusers.models.attention_processor import AttnProcessor2_0

    runtime = Runtime.pick("auto", "auto")
    assert runtime.device == "cuda" and runtime.dtype in (torch.bfloat16, torch.float16)
    service = Service([tree.root], runtime=runtime, cache_size=1)
    result = service.generate(str(tree.ba4), "ema", GenerationParams("two blue squares", steps=4, width=16, height=16,
                                                                       seed=1, batch_size=2))
    pixels = np.stack([np.asarray(i) for i in result.images])
    assert pixels.shape == (2, 16, 16, 3) and pixels.std() > 0
    pipe = service.pipeline(service.open(str(tree.ba4)), "ema")
    assert pipe.unet.dtype == runtime.dtype and pipe.unet.device.type == "cuda"
    assert all(isinstance(p, AttnProcessor2_0) for p in pipe.unet.attn_processors.values())


def test_evicted_pipeline_gives_its_gpu_memory_back(tree):
    service = Service([tree.root], runtime=Runtime.pick("cuda", "auto"), cache_size=1)
    service.pipeline(service.open(str(tree.ba2)), "ema")
    gc.collect()
    one = torch.cuda.memory_allocated()
    service.pipeline(service.open(str(tree.ba4)), "raw")  # evicts the first
    gc.collect()
    assert torch.cuda.memory_allocated() <= one * 1.05  # one pipeline's worth, not two
