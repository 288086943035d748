from pathlib import Path

import pytest
import torch

from train.config import load_config
from models.errors import WorkbenchError
from train.recipes import LatentDiffusion, TextConditioning
from train.trainer import build_model

from ..conftest import REPO, tiny_overrides


def _model(components, **model):
    overrides = [f"model.pretrained={components}"] + [f"model.{k}={v}" for k, v in model.items()]
    return build_model(load_config(REPO / "configs/tiny-phase1.yaml", overrides))


def _batch(model, n=4, res=32):
    ids = model.tokenizer(["a red circle", "two blue squares", "a white square above a purple triangle", ""][:n],
                          padding="max_length", max_length=model.tokenizer.model_max_length, return_tensors="pt").input_ids
    return {"image": torch.rand(n, 3, res, res) * 2 - 1, "input_ids": ids}


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_forward_backward_updates_only_the_unet(components, prediction_type):
    torch.manual_seed(0)
    model = _model(components, prediction_type=prediction_type, min_snr_gamma=5.0)
    model.train()
    out = model(_batch(model))
    pred, target, t = out
    assert pred.shape == target.shape == (4, 4, 8, 8) and t.shape == (4,)
    loss = model.loss(out, {})  # a batch without a DreamBooth mask or weight
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.unet.parameters())
    assert all(p.grad is None for p in model.vae.parameters())
    assert all(p.grad is None for p in model.text_encoder.parameters())
    assert not model.vae.training and not model.text_encoder.training  # frozen parts stay in eval


def test_v_target_is_the_velocity(components):
    """With a zero-noise draw replaced by hand: v = sqrt(a) eps - sqrt(1-a) x0 (Salimans & Ho 2022)."""
    model = _model(components, prediction_type="v_prediction")
    model.eval()
    torch.manual_seed(1)
    batch = _batch(model, 2)
    torch.manual_seed(2)
    _, target, t = model(batch)
    torch.manual_seed(2)
    latents = model.encode_images(batch["image"])
    eps = torch.randn(latents.shape)
    a = model.alphas_cumprod[t].view(-1, 1, 1, 1)
    assert torch.allclose(target, a.sqrt() * eps - (1 - a).sqrt() * latents, atol=1e-6)


def test_min_snr_weighting_downweights_low_noise_steps(components):
    model = _model(components, min_snr_gamma=1.0, prediction_type="epsilon")  # epsilon's weight: min(snr, gamma) / snr
    pred, target = torch.zeros(2, 4, 8, 8), torch.ones(2, 4, 8, 8)
    t = torch.tensor([5, 900])  # high SNR (weight gamma/snr << 1), low SNR (weight 1)
    per_step = [model.loss((pred[i:i + 1], target[i:i + 1], t[i:i + 1]), {}).item() for i in range(2)]
    snr = model.alphas_cumprod[5] / (1 - model.alphas_cumprod[5])
    assert per_step[1] == pytest.approx(1.0)
    assert per_step[0] == pytest.approx((1.0 / snr).item(), rel=1e-5)


def test_caption_dropout_rate(components):
    model = _model(components, caption_dropout=0.3)
    model.train()
    ids = _batch(model, 1)["input_ids"].repeat(4000, 1)
    torch.manual_seed(0)
    dropped = (model.drop_captions(ids) == model.empty_ids).all(dim=1).float().mean().item()
    assert 0.27 < dropped < 0.33
    model.eval()
    assert torch.equal(model.drop_captions(ids), ids)  # never at inference


# Each tiny config's Composer model, the resolution it is built at, and whether its text conditioning has a pooled
# output (every one has states; none has time ids before an image batch brings SDXL's)
CONDITIONING_FIELDS = {"tiny-phase1": ("LatentDiffusion", 16, False),
                       "tiny-sdxl-phase1": ("MicroConditionedUNet", 16, True),
                       "tiny-mmdit-phase1": ("RectifiedFlowTransformer", 16, True),
                       "tiny-flux": ("FluxStyleTransformer", 32, True)}


def test_every_model_encodes_text_as_one_conditioning_and_is_built_by_latent_diffusions_constructor(
        shapes_data, components, monkeypatch):
    """``encode_text`` of each Composer model is a ``TextConditioning``: the states its denoiser attends to, the pooled
    output where the family has one, no time ids (SDXL's come with an image batch). Its values are each pipeline's
    ``encode_prompt``: SD 1/2's here, SDXL's, SD3's and Flux.1's in test_sdxl_training, test_flow_transformer and
    test_flux_training. Each constructor chain runs ``LatentDiffusion.__init__`` once."""
    ran, constructor = [], LatentDiffusion.__init__

    def recorded(self, *args, **kwargs):
        ran.append(type(self).__name__)
        constructor(self, *args, **kwargs)

    monkeypatch.setattr(LatentDiffusion, "__init__", recorded)
    prompts = ["a red circle above a blue square", "two green triangles"]
    for config, (name, res, pooled) in CONDITIONING_FIELDS.items():
        model = build_model(load_config(REPO / f"configs/{config}.yaml",
                                        tiny_overrides(shapes_data, components, Path("unused"), res=res))).eval()
        assert type(model).__name__ == name and ran[-1] == name
        text = model.encode_captions(prompts)
        assert isinstance(text, TextConditioning) and text.time_ids is None and (text.pooled is not None) == pooled
        width = getattr(model.denoiser.config, "cross_attention_dim", None) or model.denoiser.config.joint_attention_dim
        assert text.states.shape[0] == 2 and text.states.shape[-1] == width
        if pooled:
            assert text.pooled.shape[0] == 2
        else:
            want, _ = model.pipeline_with(model.unet).encode_prompt(prompts, "cpu", 1, False)
            assert torch.equal(text.states, want)
    assert ran == [name for name, _, _ in CONDITIONING_FIELDS.values()]


def test_missing_pretrained_folder_is_one_clear_error(tmp_path):
    with pytest.raises(WorkbenchError, match=r"pretrained VAE not found: .*nowhere/vae does not exist"):
        build_model(load_config(REPO / "configs/tiny-phase1.yaml", [f"model.pretrained={tmp_path / 'nowhere'}"]))


@pytest.mark.slow
def test_sd2_base_instantiates_at_full_size_without_download():
    cfg = load_config(REPO / "configs/sd2-base-phase1.yaml", ["model.pretrained=null"])
    model = build_model(cfg)
    n = sum(p.numel() for p in model.unet.parameters())
    assert round(n / 1e6, 1) == 865.9
    assert model.unet.config.cross_attention_dim == model.text_encoder.config.hidden_size == 1024
    assert model.text_encoder.config.num_hidden_layers == 23  # SD2 conditions on the penultimate layer
    assert model.scaling_factor == 0.18215
    with torch.no_grad():  # one forward at a small latent size proves the wiring
        out = model.unet(torch.randn(1, 4, 8, 8), torch.tensor([10]), encoder_hidden_states=torch.randn(1, 77, 1024)).sample
    assert out.shape == (1, 4, 8, 8)


def test_pipeline_dtype_names_and_auto():
    from models.generation.device import pipeline_dtype

    assert pipeline_dtype("auto", "cpu") == torch.float32
    for names, dtype in ((("float32", "fp32"), torch.float32), (("bfloat16", "bf16"), torch.bfloat16),
                         (("float16", "fp16"), torch.float16)):
        assert all(pipeline_dtype(n, "cpu") == dtype for n in names)
    with pytest.raises(WorkbenchError, match="unknown dtype 'int8'; choose auto, float32, bfloat16 or float16"):
        pipeline_dtype("int8", "cpu")
