"""`dwb train` of an SDXL-class UNet (``tiny-sdxl``): what it conditions on in training equals what diffusers'
``StableDiffusionXLPipeline`` feeds it at sampling (both towers' states, the pooled output, the six time ids, the
empty caption as guidance's unconditional branch); a real run's preview is what `dwb sample` draws, and the folder
`dwb export` writes draws our image bit for bit in plain diffusers; ``sdxl-base`` is SDXL's published UNet, built
offline on the meta device and refused by the memory plan on a machine that cannot hold it.

One short real run shared by the module: phase 1 at 16 px, 4 batches of 8, a preview and validation at batch 4."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.checkpoints import describe, find_checkpoint, load_pipeline, read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from models.generation import Settings, generate_images
from train.trainer import build_model, train

from ..conftest import REPO, tiny_overrides

PHASE1 = REPO / "configs/tiny-sdxl-phase1.yaml"
PROMPTS = ["a red circle above a blue square", "two green triangles"]
SDXL_BASE_UNET = 2.567e9  # SDXL's UNet as published (diffusers' stable-diffusion-xl-base-1.0 unet: 2,567,463,684)
# The weights of stable-diffusion-xl-base-1.0 as published: its UNet, and the parts a run keeps frozen (vae,
# text_encoder: CLIP ViT-L/14's text tower, text_encoder_2: OpenCLIP ViT-bigG/14's, with its projection)
SDXL_BASE_WEIGHTS = {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480,
                     "text_encoder_2": 694_659_840}


@pytest.fixture(scope="module")
def model(shapes_data, components):
    """The training model as phase 1 builds it (fresh weights), in eval mode."""
    return build_model(load_config(PHASE1, tiny_overrides(shapes_data, components, Path("unused")))).eval()


@pytest.fixture(scope="module")
def pipe(model):
    return model.pipeline_with(model.unet)


@pytest.fixture(scope="module")
def run(shapes_data, components, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sdxl") / "phase1" / "checkpoints"
    keys = {"max_duration": "4ba", "save_interval": "4ba", "eval_interval": "4ba", "preview_interval": "4ba",
            "validation.path": shapes_data / "eval" / "32", "validation.max_samples": 4,
            "validation.timesteps": "[250,750]", "previews.prompts": json.dumps(PROMPTS), "previews.steps": 3}
    train(load_config(PHASE1, tiny_overrides(shapes_data, components, folder, **keys)))
    return folder / "ep0-ba4-rank0.pt"


def ids_of(model, prompts: list[str]) -> torch.Tensor:
    return model.tokenizer(prompts, padding="max_length", max_length=model.tokenizer.model_max_length,
                           truncation=True, return_tensors="pt").input_ids


def test_the_text_states_and_pooled_output_are_what_the_sdxl_pipeline_feeds_the_unet(model, pipe):
    text = model.encode_text(ids_of(model, PROMPTS))
    want, _, want_pooled, _ = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False)
    assert text.states.shape[-1] == model.unet.config.cross_attention_dim == 64 + 96  # two towers of different widths
    assert torch.equal(text.states, want) and torch.equal(text.pooled, want_pooled) and text.time_ids is None
    assert not torch.equal(text.pooled[0], text.pooled[1])  # the end token's pooled output: it tells captions apart


def test_a_dropped_caption_is_guidances_unconditional_branch(model, pipe):
    """Caption dropout trains the empty caption; the pipeline's negative branch (no negative prompt) is its encoding,
    not SDXL's zeros."""
    empty = model.encode_text(model.empty_ids.expand(len(PROMPTS), -1))
    _, negative, _, negative_pooled = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=True)
    assert torch.equal(negative, empty.states) and torch.equal(negative_pooled, empty.pooled)
    assert negative_pooled.abs().sum() > 0


def test_the_time_ids_in_training_are_what_the_pipeline_feeds_at_sampling(model, pipe):
    """Each image's original size (h, w), crop (top, left) and target size, in the order of
    ``StableDiffusionXLPipeline._get_add_time_ids``, as the UNet receives them in a training step."""
    seen = {}
    hook = model.unet.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    batch = {"image": torch.rand(3, 3, 16, 24) * 2 - 1, "input_ids": ids_of(model, [PROMPTS[0]] * 3),
             "original_size": torch.tensor([[16, 24], [480, 640], [900, 300]]),
             "crop_top_left": torch.tensor([[0, 0], [0, 37], [120, 0]])}
    try:
        model(batch)
    finally:
        hook.remove()
    projection = model.text_encoder_2.config.projection_dim
    want = torch.cat([pipe._get_add_time_ids(tuple(o.tolist()), tuple(c.tolist()), (16, 24), torch.float32,
                                             text_encoder_projection_dim=projection)
                      for o, c in zip(batch["original_size"], batch["crop_top_left"])])
    assert torch.equal(seen["added_cond_kwargs"]["time_ids"], want)
    assert want[0].tolist() == [16, 24, 0, 0, 16, 24]  # a sample's: original = target, no crop
    assert torch.equal(seen["added_cond_kwargs"]["text_embeds"], model.encode_text(batch["input_ids"]).pooled)


def test_held_out_batches_are_conditioned_as_a_sample_is_drawn(model, pipe):
    """Validation's batches carry no sizes: original = target = the image's, no crop (the pipeline's default)."""
    seen = {}
    hook = model.unet.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    latents = torch.randn(2, 4, 4, 6)
    try:
        model.denoise(latents, model.encode_text(ids_of(model, PROMPTS)), torch.randn_like(latents),
                      torch.tensor([10, 900]))
    finally:
        hook.remove()
    want = pipe._get_add_time_ids((16, 24), (0, 0), (16, 24), torch.float32,
                                  text_encoder_projection_dim=model.text_encoder_2.config.projection_dim)
    assert torch.equal(seen["added_cond_kwargs"]["time_ids"], want.expand(2, -1))


def test_each_unet_block_is_an_fsdp_unit_and_the_frozen_towers_are_not_sharded(model):
    unet = model.unet
    blocks = [*unet.down_blocks, unet.mid_block, *unet.up_blocks]
    assert all(model.fsdp_wrap_fn(b) for b in blocks)
    assert not any(model.fsdp_wrap_fn(m) for m in (unet.conv_in, unet.add_embedding, unet.time_embedding))
    assert model.text_encoder._fsdp_wrap is False and model.text_encoder_2._fsdp_wrap is False
    assert not any(p.requires_grad for p in model.text_encoder_2.parameters())


def test_the_spec_says_family_and_both_towers(run):
    spec = read_checkpoint(run)["spec"]
    assert spec["format"] == "diffusion-workbench/2" and spec["family"] == "sdxl"
    assert spec["unet"]["addition_embed_type"] == "text_time" and spec["prediction_type"] == "epsilon"
    assert spec["text_encoder"]["hidden_size"] == 64 and spec["text_encoder_2"]["hidden_size"] == 96
    info = describe(find_checkpoint(str(run)))  # what the app and evaluate ask
    assert info.family == "sdxl" and info.resolution == 16


def test_a_preview_is_what_dwb_sample_draws(run, dwb, tmp_path):
    preview = run.parent.parent / "previews" / "ba4.png"
    params = json.loads(preview.with_suffix(".json").read_text())
    out = tmp_path / "sample.png"
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    r = dwb("sample", str(run), str(out), *args, "--seeds", "2", "--steps", "3", "--guidance",
            str(params["guidance"]), "--size", "16", "--weights", "ema" if params["ema"] else "raw")
    assert r.returncode == 0, r.stderr
    a, b = np.asarray(Image.open(preview)), np.asarray(Image.open(out))
    cells = (slice(24, None), slice(300, None))  # below the title, right of the prompt labels
    assert a.shape == b.shape and np.array_equal(a[cells], b[cells]) and a[cells].std() > 0


def test_the_exported_folder_draws_our_image_in_plain_diffusers(run, dwb, tmp_path):
    """Guided (the empty caption's branch) and not square: width 32, height 16."""
    from diffusers import StableDiffusionXLPipeline

    r = dwb("export", str(run), str(tmp_path / "folder"))
    assert r.returncode == 0, r.stderr
    settings = Settings(steps=4, guidance=3.0, width=32, height=16, sampler="Euler")
    ours = generate_images(load_pipeline(run, ema=True), PROMPTS[:1], [7], settings)[0]

    plain = StableDiffusionXLPipeline.from_pretrained(tmp_path / "folder", local_files_only=True)
    assert plain.config.force_zeros_for_empty_prompt is False
    image = plain(PROMPTS[0], num_inference_steps=4, guidance_scale=3.0, width=32, height=16,
                  generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
    assert ours.shape == (16, 32, 3)
    assert np.array_equal(ours, (image * 255).round().astype(np.uint8)) and ours.std() > 0


def test_the_single_file_export_reads_back_our_image(run, dwb, tmp_path):
    """sgm's layout (what AUTOMATIC1111, ComfyUI and Forge load), read back by diffusers' ``from_single_file`` with
    the configs and tokenizer beside it: the same image, guided."""
    r = dwb("export", str(run), str(tmp_path / "tiny-sdxl.safetensors"))
    assert r.returncode == 0, r.stderr
    settings = Settings(steps=3, guidance=3.0, width=16, height=24, sampler="Euler")
    ours = generate_images(load_pipeline(run, ema=True), PROMPTS[1:], [3], settings)[0]
    theirs = generate_images(load_pipeline(tmp_path / "tiny-sdxl.safetensors"), PROMPTS[1:], [3], settings)[0]
    assert np.array_equal(ours, theirs) and ours.std() > 0


def test_the_full_size_unet_is_sdxls_and_the_plan_refuses_it_here(monkeypatch):
    """configs/sdxl-base-phase{1,2,3}.yaml build SDXL's published UNet (2.567B weights) offline on the meta device;
    `dwb train` on a CPU with 16 GiB to spare refuses it in one line before a weight is made (weights, gradients and
    AdamW state of 2,567M weights, and the 901M frozen ones: 41.6 GiB), instead of being killed for memory."""
    from models.checkpoints import build_unet
    from train.trainer import check_memory

    with torch.device("meta"):
        count = sum(p.numel() for p in build_unet("sdxl-base").parameters())
    assert abs(count / SDXL_BASE_UNET - 1) < 0.001, count
    configs = [load_config(REPO / f"configs/sdxl-base-phase{n}.yaml", ["model.pretrained=null"]) for n in (1, 2, 3)]
    assert [(c.model.architecture, c.data.resolution) for c in configs] == [("sdxl-base", r) for r in (256, 512, 1024)]
    monkeypatch.setenv("DWB_MEMORY_MB", "4096")  # under what any test machine has free
    with pytest.raises(WorkbenchError) as refused:
        check_memory(configs[0], "cpu")
    line = str(refused.value)
    # float32 weights, gradients and AdamW's two moments of the UNet (phase 1 keeps no EMA copy), the float32 copy of
    # it rank 0 draws previews with under FSDP on a CPU, float32 frozen parts
    frozen = sum(n for part, n in SDXL_BASE_WEIGHTS.items() if part != "unet")
    assert not configs[0].ema.enabled and configs[0].fsdp and configs[0].preview_interval
    need = SDXL_BASE_WEIGHTS["unet"] * (4 + 4 + 2 * 4 + 4) + frozen * 4
    assert "\n" not in line and f"'sdxl-base' (sdxl-base-phase1) needs at least {need / 2**30:.1f} GiB" in line
    assert f"{count / 1e6:,.0f}M trained weights and {frozen / 1e6:,.0f}M frozen ones" in line
    assert "4.0 GiB is free" in line
