"""Random, seeded preference-score weights in each model's published file layout, made by the authors' own code
where it runs here, and the authors' packages as installed (``scripts/setup-reference-packages.sh``): a test that
needs one that is not installed is skipped, and fails under CI (``tests.conftest.unavailable``)."""
from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import torch

from ..conftest import unavailable

# ViT-H-14's architecture at small widths: the image tower keeps 80-wide heads, the text tower 64-wide ones
TINY_HPS = {"embed_dim": 32,
            "vision_cfg": {"image_size": 56, "layers": 2, "width": 160, "head_width": 80, "patch_size": 14},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2}}
HPS_ARGS = dict(precision="amp", device="cpu", jit=False, force_quick_gelu=False, force_custom_text=False,
                force_patch_dropout=False, force_image_size=None, pretrained_image=False, image_mean=None,
                image_std=None, light_augmentation=True, aug_cfg={}, output_dict=True, with_score_predictor=False,
                with_region_predictor=False)  # hpsv2.img_score.initialize_model's arguments


def test_images(n: int = 4, size: int = 64, seed: int = 0) -> torch.Tensor:
    """(n, 3, size, size) uint8: a coloured square on a shaded background, each image its own colours and place."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        images[i] = (np.linspace(0, 255, size)[None, :, None] * rng.uniform(0.2, 1, 3)).astype(np.uint8)
        x, y, s = rng.integers(0, size // 2, 3)
        images[i, y:y + s + 8, x:x + s + 8] = rng.integers(0, 256, 3)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


def hpsv2_package(tmp: Path):
    """The installed ``hpsv2`` package, imported from a copy beside the BPE vocabulary its 1.2.0 wheel omits
    (the same file OpenCLIP ships, which its tokenizer opens at import)."""
    import importlib.util

    import open_clip

    spec = importlib.util.find_spec("hpsv2")
    if spec is None:
        unavailable("the hpsv2 reference package is not installed: bash scripts/setup-reference-packages.sh")
    shutil.copytree(Path(spec.origin).parent, tmp / "hpsv2")
    shutil.copy(Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz", tmp / "hpsv2/src/open_clip/")
    sys.path.insert(0, str(tmp))
    for name in [m for m in sys.modules if m == "hpsv2" or m.startswith("hpsv2.")]:
        del sys.modules[name]
    import hpsv2.img_score
    from hpsv2.src.open_clip import factory

    factory._MODEL_CONFIGS["tiny-ViT-H-14"] = TINY_HPS
    return hpsv2.img_score, factory


def write_hps(folder: Path, factory) -> Path:
    """``HPS_v2.1_compressed.pt``: ``{"state_dict": ...}`` of the authors' OpenCLIP model, seeded."""
    torch.manual_seed(1)
    model, _, _ = factory.create_model_and_transforms("tiny-ViT-H-14", None, **HPS_ARGS)
    path = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, path)
    return path


def image_reward_package():
    """The installed ``ImageReward`` package (1.5), importable next to transformers 4.57: three helpers its
    med.py imports from ``transformers.modeling_utils`` live in ``transformers.pytorch_utils`` now (the same
    functions), and ``clip`` (OpenAI's, not on PyPI) serves only its CLIP and aesthetic baselines."""
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    for name in ("apply_chunking_to_forward", "find_pruneable_heads_and_indices", "prune_linear_layer"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name))
    sys.modules.setdefault("clip", types.ModuleType("clip"))
    import importlib.util

    if importlib.util.find_spec("ImageReward") is None:
        unavailable("the image-reward reference package is not installed: bash scripts/setup-reference-packages.sh")
    import ImageReward.utils
    from ImageReward.models.BLIP import blip, blip_pretrain, vit

    return ImageReward.utils, blip, blip_pretrain, vit


def write_bert_vocab(folder: Path, words: list[str]) -> Path:
    """A small uncased WordPiece vocabulary in BERT's layout (``vocab.txt``, special tokens first)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(words) - set(letters)), *letters,
             *[f"##{c}" for c in letters], *list("0123456789.,-")]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder / "vocab.txt"


def write_image_reward(folder: Path, words: list[str]):
    """``ImageReward.pt`` and ``med_config.json`` as the authors publish them, from their own classes: BLIP's
    ViT at 128 wide and 2 deep (published: 1,024 and 24), the text tower 768 wide (their head's input) and
    1 deep (published: 12), seeded; the tokenizer is BERT's with a small vocabulary.
    Returns (the authors' ``load``, a context that makes their code build these sizes and read this vocabulary)."""
    from contextlib import contextmanager

    utils, blip, blip_pretrain, vit = image_reward_package()
    write_bert_vocab(folder, words)
    n_vocab = len((folder / "vocab.txt").read_text().split()) + 2  # BLIP adds [DEC] and [ENC]
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 256,
           "layer_norm_eps": 1e-12, "max_position_embeddings": 40, "model_type": "bert", "num_attention_heads": 12,
           "num_hidden_layers": 1, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": n_vocab,
           "encoder_width": 128, "add_cross_attention": True}
    (folder / "med_config.json").write_text(json.dumps(med))

    bert = blip.BertTokenizer

    class LocalBert(bert):  # 'bert-base-uncased' read from the fixture's folder
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            return bert.from_pretrained(folder if name == "bert-base-uncased" else name, *args, **kwargs)

    def small_vit(kind, image_size, *args, **kwargs):
        return vit.VisionTransformer(img_size=image_size, patch_size=16, embed_dim=128, depth=2, num_heads=2), 128

    @contextmanager
    def sizes():
        with torch.no_grad(), __import__("pytest").MonkeyPatch.context() as mp:
            mp.setattr(blip, "BertTokenizer", LocalBert)
            mp.setattr(blip_pretrain, "create_vit", small_vit)
            yield

    with sizes():
        torch.manual_seed(2)
        model = utils.ImageReward(med_config=str(folder / "med_config.json"), device="cpu")
        with torch.no_grad():  # the head's published init (std 1/769) scores every image alike: spread it as trained
            for layer in model.mlp.layers:
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.normal_(0, layer.in_features ** -0.5)
        torch.save(model.state_dict(), folder / "ImageReward.pt")
    return utils.load, sizes


def write_pickscore(folder: Path, tokenizer_folder: Path) -> Path:
    """PickScore_v1's layout (a transformers ``CLIPModel`` folder with its processor) at 32 wide and 2 deep
    (published: CLIP-H, 1,280 / 1,024 wide, 32 / 24 deep), seeded, with the tiny tokenizer; the text tower
    pools at the tokenizer's own end token, as CLIP does at its 49407."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(tokenizer_folder)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    config = CLIPConfig(
        text_config=dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, **ids),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16)
    torch.manual_seed(4)
    CLIPModel(config).save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  tokenizer=tokenizer).save_pretrained(folder)
    return folder


# open_clip's name for a vision tower tensor -> transformers' CLIPModel name (per block: the ``{i}`` layer)
OPEN_CLIP_VISION = {"class_embedding": "embeddings.class_embedding",
                    "positional_embedding": "embeddings.position_embedding.weight",
                    "conv1.weight": "embeddings.patch_embedding.weight", "ln_pre": "pre_layrnorm",
                    "ln_post": "post_layernorm"}
OPEN_CLIP_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
                   "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}


def open_clip_vision_as_transformers(state: dict) -> dict:
    """An open_clip CLIP's image tower and projection (``visual.*``) under transformers' CLIPModel names: the
    same tensors, the fused attention input projection split into q, k and v, the projection transposed."""
    out = {"visual_projection.weight": state["visual.proj"].T.contiguous()}
    for key, value in state.items():
        if not key.startswith("visual.") or key == "visual.proj":
            continue
        name = key.removeprefix("visual.")
        if name.startswith("transformer.resblocks."):
            i, rest = name.removeprefix("transformer.resblocks.").split(".", 1)
            prefix = f"vision_model.encoder.layers.{i}."
            if rest.startswith("attn.in_proj_"):
                kind = rest.removeprefix("attn.in_proj_")
                for part, chunk in zip("qkv", value.chunk(3)):
                    out[f"{prefix}self_attn.{part}_proj.{kind}"] = chunk.clone()
                continue
            stem, _, leaf = rest.rpartition(".")
            out[prefix + f"{OPEN_CLIP_BLOCK[stem]}.{leaf}"] = value
        elif name in OPEN_CLIP_VISION:
            out[f"vision_model.{OPEN_CLIP_VISION[name]}"] = value
        else:  # ln_pre.weight and the like
            stem, _, leaf = name.rpartition(".")
            out[f"vision_model.{OPEN_CLIP_VISION[stem]}.{leaf}"] = value
    return out


def write_open_clip_as_transformers(model, name: str, folder: Path, tokenizer_dir: Path) -> Path:
    """``model`` (open_clip's, built from its config ``name`` with QuickGELU, OpenAI's activation) saved as a
    transformers CLIP folder holding the same image-tower weights; the text tower, which no image score uses,
    is a small random one. The image processor is transformers' CLIP default (224 px, bicubic, OpenAI's mean
    and std), as OpenAI's ViT-L/14 folder ships it."""
    import open_clip
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    cfg = open_clip.get_model_config(name)
    vision = cfg["vision_cfg"]
    tokenizer = CLIPTokenizer.from_pretrained(tokenizer_dir)
    config = CLIPConfig(
        text_config=dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(hidden_size=vision["width"], intermediate_size=4 * vision["width"],
                           num_hidden_layers=vision["layers"], num_attention_heads=vision["width"] // 64,
                           image_size=vision["image_size"], patch_size=vision["patch_size"], hidden_act="quick_gelu"),
        projection_dim=cfg["embed_dim"])
    ours = CLIPModel(config)
    missing, unexpected = ours.load_state_dict(open_clip_vision_as_transformers(model.state_dict()), strict=False)
    assert not unexpected and all(k.startswith(("text_", "logit_scale")) for k in missing), (missing, unexpected)
    ours.save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(folder)
    return folder
