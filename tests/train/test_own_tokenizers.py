"""Each text tower reads its own tokenizer in training: ``sdxl-base`` from an SDXL folder feeds its second tower the ids
of the folder's ``tokenizer_2/`` (OpenCLIP's, padded with "!"), and ``flux-schnell`` feeds its T5 the ids of T5's own
tokenizer over 512 tokens, so that what the model is conditioned on for a batch of the real loader is what diffusers'
``StableDiffusionXLPipeline`` and ``FluxPipeline`` loaded from the same folder make of the same captions; a dropped
caption is each tokenizer's empty caption and the other phrasing is swapped in for both towers under one draw per
sample; a checkpoint reopened (`dwb sample`, `dwb export`) draws with the same second tokenizer.

The folders are tiny pipelines written by diffusers' own ``save_pretrained``: SDXL's with the CLIP vocabulary in both
tokenizer slots, the second padding with "!" as SDXL publishes it; Flux.1's with a T5 tokenizer fitted offline on the
shapes captions' words (a ``tokenizers`` Unigram model in ``T5TokenizerFast``)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from train.config import load_config
from train.trainer import build_model, train, training_dataloader

from ..conftest import REPO, tiny_overrides

# SDXL's UNet layout at tiny sizes (over SDXL-base's published config): two towers 32 + 48 wide side by side, the
# second's pooled output (48) and six time ids of 8
SDXL_UNET = dict(sample_size=8, block_out_channels=[32, 64], layers_per_block=1,
                 down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
                 up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"], transformer_layers_per_block=[1, 1],
                 attention_head_dim=[2, 4], cross_attention_dim=32 + 48, addition_time_embed_dim=8,
                 projection_class_embeddings_input_dim=48 + 6 * 8, norm_num_groups=8)
# Flux.1-schnell's transformer at tiny sizes: 4-channel latents packed 2x2, T5 32 wide, CLIP's pooled output 32 wide
FLUX_TRANSFORMER = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                        axes_dims_rope=[4, 4, 8], guidance_embeds=False)


def _clip_tokenizer(folder: Path, pad: str):
    from transformers import CLIPTokenizer

    from models.checkpoints.clip_bpe import write_clip_tokenizer

    return CLIPTokenizer.from_pretrained(write_clip_tokenizer(folder, pad_token=pad))


def _clip(tokenizer, width: int, projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
                            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
                            projection_dim=width, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def _vae(**flow):
    from diffusers import AutoencoderKL

    return AutoencoderKL(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         sample_size=32, norm_num_groups=8, **flow)


def _t5_tokenizer(captions: list[str]):
    """A T5 tokenizer fitted on the captions: a Unigram model with T5's special tokens, ``</s>`` after each text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    model = Tokenizer(models.Unigram())
    model.pre_tokenizer = pre_tokenizers.Metaspace()
    model.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    model.train_from_iterator(captions, trainer)
    model.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=model, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                           extra_ids=0)


@pytest.fixture(scope="module")
def sdxl_folder(tmp_path_factory) -> Path:
    from diffusers import StableDiffusionXLPipeline

    from models.checkpoints import build_unet
    from models.checkpoints.clip_bpe import END

    root = tmp_path_factory.mktemp("sdxl-own-tokenizers")
    tokenizer, tokenizer_2 = _clip_tokenizer(root / "tok", END), _clip_tokenizer(root / "tok2", "!")
    torch.manual_seed(0)
    StableDiffusionXLPipeline(vae=_vae(scaling_factor=0.13025), text_encoder=_clip(tokenizer, 32),
                              text_encoder_2=_clip(tokenizer_2, 48, projection=True), tokenizer=tokenizer,
                              tokenizer_2=tokenizer_2, unet=build_unet("sdxl-base", SDXL_UNET),
                              scheduler=_sdxl_scheduler()).save_pretrained(root / "sdxl")
    return root / "sdxl"


def _sdxl_scheduler():
    from diffusers import EulerDiscreteScheduler

    return EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                                  timestep_spacing="leading")


def _sdxl_config(shapes_data, folder, save_folder=Path("unused"), **extra):
    keys = {"model.architecture": "sdxl-base", "model.pretrained": folder, "model.unet": json.dumps(SDXL_UNET),
            "model.other_phrasing": 0.5, **extra}
    return load_config(REPO / "configs/tiny-sdxl-phase1.yaml", tiny_overrides(shapes_data, Path("unused"), save_folder,
                                                                              **keys))


@pytest.fixture(scope="module")
def sdxl(shapes_data, sdxl_folder):
    """(model in eval mode, a batch of 8 from its training loader, their samples, the folder's pipeline)."""
    from diffusers import StableDiffusionXLPipeline

    cfg = _sdxl_config(shapes_data, sdxl_folder)
    model = build_model(cfg).eval()
    loader = training_dataloader(cfg, model)
    samples = [loader.dataset[i] for i in range(8)]
    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_folder, local_files_only=True)
    return model, loader.collate_fn(samples), samples, pipe


def _captions(samples, key="caption"):
    return [s[key] for s in samples]


def test_sdxl_base_reads_the_folders_second_tokenizer_as_the_pipeline_does(sdxl):
    model, batch, samples, pipe = sdxl
    assert model.tokenizer_2.pad_token == "!" and model.max_length_2 == 77
    assert batch["input_ids_2"].shape == batch["input_ids"].shape == (8, 77)
    assert not torch.equal(batch["input_ids"], batch["input_ids_2"])  # "!" pads the second, the end token the first
    _, text = model.latents_and_text(batch)
    want, _, want_pooled, _ = pipe.encode_prompt(_captions(samples), do_classifier_free_guidance=False)
    assert torch.equal(text.states, want) and torch.equal(text.pooled, want_pooled)
    ours = model.pipeline_with(model.unet)  # what previews and `dwb sample` draw with
    assert ours.tokenizer_2 is model.tokenizer_2


def test_sdxl_base_drops_captions_to_each_tokenizers_empty_caption(sdxl):
    model, batch, samples, pipe = sdxl
    kept = model.caption_dropout, model.other_phrasing
    model.train()
    model.caption_dropout, model.other_phrasing = 1.0, 0.0
    try:
        _, text = model.latents_and_text(batch)
    finally:
        model.caption_dropout, model.other_phrasing = kept
        model.eval()
    _, negative, _, negative_pooled = pipe.encode_prompt(_captions(samples), negative_prompt="",
                                                         do_classifier_free_guidance=True)
    assert torch.equal(text.states, negative) and torch.equal(text.pooled, negative_pooled)


def test_one_draw_per_sample_swaps_and_drops_the_caption_of_both_towers(sdxl):
    """Each sample's conditioning, both towers' halves and the pooled output, is the pipeline's of one text: its
    caption, its other phrasing or the empty caption (never one tower's caption beside the other's phrasing)."""
    model, batch, samples, pipe = sdxl
    texts = {"caption": _captions(samples), "alt": _captions(samples, "caption_alt"), "empty": [""] * len(samples)}
    assert texts["caption"] != texts["alt"]
    encoded = {k: pipe.encode_prompt(v, do_classifier_free_guidance=False) for k, v in texts.items()}
    kept = model.caption_dropout
    model.train()
    model.caption_dropout = 0.4
    seen = set()
    try:
        torch.manual_seed(3)
        for _ in range(4):
            _, text = model.latents_and_text(batch)
            for i in range(len(samples)):
                kinds = {k for k, (s, _, p, _) in encoded.items()
                         if torch.allclose(text.states[i], s[i], atol=1e-6)
                         and torch.allclose(text.pooled[i], p[i], atol=1e-6)}
                assert kinds, f"sample {i}: the towers read different texts"
                seen |= kinds
    finally:
        model.caption_dropout = kept
        model.eval()
    assert seen == {"caption", "alt", "empty"}


@pytest.fixture(scope="module")
def flux_folder(shapes_data, tmp_path_factory) -> Path:
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    from models.checkpoints import family_scheduler
    from models.families import family_named
    from models.checkpoints.clip_bpe import END
    from models.datasets import open_local

    root = tmp_path_factory.mktemp("flux-own-tokenizers")
    data = open_local(shapes_data / "16")
    t5_tokenizer = _t5_tokenizer([data[i]["caption"] for i in range(len(data))])
    tokenizer = _clip_tokenizer(root / "tok", END)
    torch.manual_seed(0)
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                 feed_forward_proj="gated-gelu", pad_token_id=t5_tokenizer.pad_token_id,
                                 eos_token_id=t5_tokenizer.eos_token_id, decoder_start_token_id=0))
    FluxPipeline(transformer=FluxTransformer2DModel(**FLUX_TRANSFORMER), scheduler=family_scheduler(family_named("flux"), {}),
                 vae=_vae(scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False),
                 text_encoder=_clip(tokenizer, 32), tokenizer=tokenizer, text_encoder_2=t5,
                 tokenizer_2=t5_tokenizer).save_pretrained(root / "flux")
    return root / "flux"


def _flux_config(shapes_data, folder, save_folder=Path("unused"), **extra):
    keys = {"model.architecture": "flux-schnell", "model.pretrained": folder,
            "model.transformer": json.dumps(FLUX_TRANSFORMER), **extra}
    return load_config(REPO / "configs/tiny-flux.yaml", tiny_overrides(shapes_data, Path("unused"), save_folder,
                                                                       **keys))


def test_flux_schnell_reads_t5s_own_tokenizer_as_the_pipeline_does(shapes_data, flux_folder):
    from diffusers import FluxPipeline
    from transformers import T5TokenizerFast

    from models.checkpoints import T5_TOKENS

    cfg = _flux_config(shapes_data, flux_folder)
    model = build_model(cfg).eval()
    assert isinstance(model.tokenizer_2, T5TokenizerFast) and model.max_length_2 == T5_TOKENS == 512
    loader = training_dataloader(cfg, model)
    samples = [loader.dataset[i] for i in range(8)]
    batch = loader.collate_fn(samples)
    assert batch["input_ids_2"].shape == (8, T5_TOKENS) and batch["input_ids"].shape == (8, 77)
    _, text = model.latents_and_text(batch)
    pipe = FluxPipeline.from_pretrained(flux_folder, local_files_only=True)
    want, want_pooled, _ = pipe.encode_prompt(_captions(samples), prompt_2=None, max_sequence_length=512)
    assert torch.equal(text.states, want) and torch.equal(text.pooled, want_pooled)
    empty = model.encode_text(model.empty_ids.expand(2, -1), model.empty_ids_2.expand(2, -1))
    want, want_pooled, _ = pipe.encode_prompt(["", ""], prompt_2=None, max_sequence_length=512)
    assert torch.equal(empty.states, want) and torch.equal(empty.pooled, want_pooled)


def test_t5_over_256_tokens_reaches_the_transformer_as_256(shapes_data, flux_folder):
    """``model.text_tokens: 256`` (MLPerf's T5 length): the loader pads T5's ids to 256, a training forward hands the
    transformer 256 text tokens, and they are FluxPipeline's prompt embeddings at ``max_sequence_length=256``."""
    from diffusers import FluxPipeline

    cfg = _flux_config(shapes_data, flux_folder, **{"model.text_tokens": 256})
    model = build_model(cfg).eval()
    loader = training_dataloader(cfg, model)
    samples = [loader.dataset[i] for i in range(4)]
    batch = loader.collate_fn(samples)
    assert batch["input_ids_2"].shape == (4, 256) and model.empty_ids_2.shape == (1, 256)
    fed = []
    hook = model.transformer.register_forward_pre_hook(lambda m, a, kw: fed.append(kw), with_kwargs=True)
    try:
        model(batch)  # eval mode: no caption dropout
    finally:
        hook.remove()
    states = fed[0]["encoder_hidden_states"]
    assert states.shape[:2] == (4, 256) and fed[0]["txt_ids"].shape == (256, 3)
    pipe = FluxPipeline.from_pretrained(flux_folder, local_files_only=True)
    want, want_pooled, _ = pipe.encode_prompt(_captions(samples), prompt_2=None, max_sequence_length=256)
    assert torch.equal(states, want) and torch.equal(fed[0]["pooled_projections"], want_pooled)


@pytest.fixture(scope="module")
def flux_run(shapes_data, flux_folder, tmp_path_factory) -> Path:
    """Two batches of `dwb train` of flux-schnell (tiny) on the FLUX.1 folder: its checkpoint."""
    folder = tmp_path_factory.mktemp("flux-run") / "checkpoints"
    train(_flux_config(shapes_data, flux_folder, folder, max_duration="2ba", save_interval="2ba",
                       eval_interval="null", preview_interval="null", **{"ema.enabled": "false"}))
    return folder / "ep0-ba2-rank0.pt"


def test_a_trained_flux_schnell_draws_with_t5s_tokenizer_after_export(flux_run, flux_folder, dwb, tmp_path):
    """The checkpoint reopened (`dwb sample`'s door) encodes prompts as the source folder's pipeline does, and the
    folder `dwb export` writes holds T5's tokenizer and draws our image in plain FluxPipeline."""
    from diffusers import FluxPipeline
    from transformers import T5TokenizerFast

    from models.checkpoints import load_pipeline
    from models.generation import Settings, generate_images

    run = flux_run
    prompts = ["a red circle above a blue square", "two green triangles"]
    reopened = load_pipeline(run)
    assert isinstance(reopened.tokenizer_2, T5TokenizerFast)
    source = FluxPipeline.from_pretrained(flux_folder, local_files_only=True)
    for ours, theirs in zip(reopened.encode_prompt(prompts, None), source.encode_prompt(prompts, None)):
        assert torch.equal(ours, theirs)

    r = dwb("export", str(run), str(tmp_path / "export"))
    assert r.returncode == 0, r.stderr
    plain = FluxPipeline.from_pretrained(tmp_path / "export", local_files_only=True)
    assert isinstance(plain.tokenizer_2, T5TokenizerFast)
    assert plain.tokenizer_2(prompts).input_ids == source.tokenizer_2(prompts).input_ids
    settings = Settings(steps=3, guidance=0.0, width=16, height=16, sampler="Euler")
    image = generate_images(reopened, prompts[:1], [7], settings)[0]
    drawn = plain(prompts[0], num_inference_steps=3, width=16, height=16,
                  generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
    assert np.array_equal(image, (drawn * 255).round().astype(np.uint8)) and image.std() > 0


def test_the_sdxl_spec_carries_the_second_tokenizer_a_reopened_checkpoint_draws_with(sdxl):
    """The spec every checkpoint carries holds tokenizer_2's files; the pipeline a checkpoint is reopened as
    (`dwb sample`, `dwb export`: ``open.pipeline_from_composer``) reads the second tower's prompts with it."""
    from models.checkpoints import make_spec
    from models.checkpoints import assemble_pipeline
    from models.families import family_named
    from models.readers.tokenizer_files import tokenizer_from_files

    model, batch, samples, pipe = sdxl
    spec = make_spec(model, "sdxl-base", 16)
    tokenizer_2 = tokenizer_from_files(spec["tokenizer_2"], where="spec")
    assert tokenizer_2.pad_token == "!"
    assert torch.equal(tokenizer_2(_captions(samples), padding="max_length", max_length=77,
                                   return_tensors="pt").input_ids, batch["input_ids_2"])
    sdxl = family_named("sdxl")
    parts = {name: getattr(model, name) for name in ("unet", "vae", "text_encoder", "text_encoder_2")}
    tokenizers = {"tokenizer": tokenizer_from_files(spec["tokenizer"], where="spec"), "tokenizer_2": tokenizer_2}
    reopened = assemble_pipeline(sdxl, parts, tokenizers, sdxl.assembly.spec_settings(spec))
    for ours, theirs in zip(reopened.encode_prompt(_captions(samples), do_classifier_free_guidance=False),
                            pipe.encode_prompt(_captions(samples), do_classifier_free_guidance=False)):
        assert ours is theirs is None or torch.equal(ours, theirs)


def test_a_t5_tokenizer_saved_with_its_sentencepiece_model_reopens_from_the_spec():
    """FLUX.1's T5 tokenizer saves its SentencePiece model (binary) beside ``tokenizer.json`` and ``add_prefix_space``
    in its config, which asks a reload to convert that model again; the spec keeps the text files, and the tokenizer
    reopens from them with the same ids."""
    from transformers import T5TokenizerFast

    from models.checkpoints.spec import tokenizer_files
    from models.readers.tokenizer_files import tokenizer_from_files

    prompts = ["a red circle above a blue square", "two green triangles"]
    t5 = _t5_tokenizer(prompts * 20)

    class AsPublished:
        def save_pretrained(self, folder):
            t5.save_pretrained(folder)
            config = Path(folder) / "tokenizer_config.json"
            config.write_text(json.dumps({**json.loads(config.read_text()), "add_prefix_space": True}))
            (Path(folder) / "spiece.model").write_bytes(bytes(range(256)))

    files = tokenizer_files(AsPublished())
    assert "spiece.model" not in files and "add_prefix_space" not in json.loads(files["tokenizer_config.json"])
    reopened = tokenizer_from_files(files, where="spec", cls=T5TokenizerFast)
    assert reopened(prompts).input_ids == t5(prompts).input_ids


def test_flux_schnell_loads_t5s_tokenizer_as_flux_publishes_it(flux_folder, tmp_path):
    """FLUX.1's tokenizer_2 sets ``add_prefix_space`` beside its SentencePiece model: training loads it from
    ``tokenizer.json`` (without the sentencepiece package), with the ids the saved tokenizer gives."""
    import shutil

    from transformers import T5TokenizerFast

    from models.checkpoints import load_t5_parts

    published = tmp_path / "flux"
    for part in ("text_encoder_2", "tokenizer_2"):
        shutil.copytree(flux_folder / part, published / part)
    config = published / "tokenizer_2" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "add_prefix_space": True}))
    (published / "tokenizer_2" / "spiece.model").write_bytes(bytes(range(256)))
    _, tokenizer = load_t5_parts(str(published))
    prompts = ["a red circle above a blue square", "two green triangles"]
    saved = T5TokenizerFast.from_pretrained(flux_folder / "tokenizer_2", local_files_only=True)
    assert tokenizer(prompts).input_ids == saved(prompts).input_ids


def test_flux_schnell_without_a_pretrained_folder_is_one_line(shapes_data):
    """Its T5 and T5's tokenizer are pretrained parts: no folder is a one-line refusal naming what to set."""
    from models.errors import WorkbenchError

    with pytest.raises(WorkbenchError) as refused:
        build_model(_flux_config(shapes_data, "null"))
    assert str(refused.value).startswith("config key 'model.pretrained': flux-schnell loads its T5 encoder")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("attack, message", [
    ("auto_map", "asks for custom code"),
    ("file outside", r"tokenizer file named '\.\./\.\./.*escaped.json'.*refused"),
])
def test_a_spec_whose_second_tokenizer_asks_for_code_or_a_file_outside_is_refused(flux_run, tmp_path, attack,
                                                                                   message):
    """The second tokenizer's files in a checkpoint's spec are checked as the first's: custom code (``auto_map``) or a
    file named outside is one line, and nothing is written there."""
    from models.checkpoints import load_pipeline
    from models.errors import CheckpointError

    from ..checkpoints.test_door import _rewrite

    escape = f"../../{tmp_path.name}-escaped.json"

    def edit(state):
        files = state["callbacks"]["ModelSpec"]["spec"]["tokenizer_2"]
        if attack == "auto_map":
            config = json.loads(files["tokenizer_config.json"])
            files["tokenizer_config.json"] = json.dumps({**config, "auto_map": {"AutoTokenizer": ["evil.T", None]}})
        else:
            files[escape] = "{}"

    hostile = tmp_path / "hostile.pt"
    _rewrite(flux_run, hostile, edit)
    with pytest.raises(CheckpointError, match=message):
        load_pipeline(hostile)
    import tempfile

    assert not (Path(tempfile.gettempdir()).parent / f"{tmp_path.name}-escaped.json").exists()
