"""The full copy of an FSDP run's denoiser that rank 0 draws previews with (``train.callbacks.drawing_copy``): made
on the meta device from the gathered weights, in the dtype training computes in, with the checkpoint's
fingerprint. Made the usual way, every weight was first drawn at random on rank 0's CPU while the other ranks
waited."""
import pytest
import torch

from models.checkpoints import build_unet, fingerprint
from models.errors import WorkbenchError
from train.callbacks.validation import drawing_copy

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def unet():
    return build_unet("tiny", {}).eval()


def gathered(unet) -> dict[str, torch.Tensor]:
    """The weights as FSDP's full state dict hands them to rank 0: tensors of their own, on the CPU."""
    return {name: tensor.clone() for name, tensor in unet.state_dict().items()}


def test_the_drawing_copy_holds_the_gathered_weights_themselves_with_no_random_start(unet):
    weights = gathered(unet)
    rng = torch.random.get_rng_state()
    copy, weights_hash = drawing_copy(unet, weights, CPU, torch.float32)
    assert torch.equal(torch.random.get_rng_state(), rng)  # nothing was drawn at random
    assert all(p.data_ptr() == weights[name].data_ptr() for name, p in copy.named_parameters())  # no copy either
    assert weights_hash == fingerprint(unet)


def test_a_bfloat16_copy_keeps_the_checkpoints_fingerprint_and_takes_float32_inputs(unet):
    """The copy of an amp_bf16 run: bfloat16 weights (half the memory), the fingerprint of the float32 weights a
    checkpoint holds, and a forward that takes the float32 tensors of the pipeline's other parts (autocast)."""
    copy, weights_hash = drawing_copy(unet, gathered(unet), CPU, torch.bfloat16)
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert weights_hash == fingerprint(unet)
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(2, unet.config.in_channels, 8, 8, generator=g)
    text = torch.randn(2, 4, unet.config.cross_attention_dim, generator=g)
    steps = torch.tensor([10, 500])
    with torch.no_grad():
        full, half = unet(latents, steps, text).sample, copy(latents, steps, text).sample
    assert half.dtype == torch.bfloat16
    assert (full - half.float()).abs().max() < 0.05 * full.abs().max()  # bfloat16's rounding (1.2% measured)


def test_a_tensor_the_gathered_weights_lack_is_one_line():
    from diffusers import ConfigMixin, ModelMixin
    from diffusers.configuration_utils import register_to_config

    class Tabled(ModelMixin, ConfigMixin):
        @register_to_config
        def __init__(self, width: int = 2):
            super().__init__()
            self.linear = torch.nn.Linear(width, width)
            self.register_buffer("table", torch.arange(width), persistent=False)  # in no state dict

    model = Tabled()
    with pytest.raises(WorkbenchError, match="^the full Tabled gathered for drawing holds no table$"):
        drawing_copy(model, gathered(model), CPU, torch.float32)
