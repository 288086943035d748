import numpy as np
import torch

from train.config import DataConfig
from train.data.loader import build_dataloader, predownload_for
from models.datasets.mds import count_samples


def test_loader_batches_images_and_token_ids(shapes_data, components):
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(components / "tokenizer")
    cfg = DataConfig(path=str(shapes_data / "32"), resolution=32)
    batch = next(iter(build_dataloader(cfg, tok, batch_size=8, seed=0)))
    assert batch["image"].shape == (8, 3, 32, 32) and batch["image"].dtype == torch.uint8  # [-1, 1] in the model
    assert 0 <= batch["image"].min() < batch["image"].max() <= 255
    assert batch["input_ids"].shape == (8, tok.model_max_length)
    assert (batch["input_ids"][:, 0] == tok.bos_token_id).all()


def test_loader_is_deterministic_by_seed(shapes_data, components):
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(components / "tokenizer")
    cfg = DataConfig(path=str(shapes_data / "16"), resolution=16)
    first = [b["input_ids"] for b in build_dataloader(cfg, tok, batch_size=16, seed=5)]
    again = [b["input_ids"] for b in build_dataloader(cfg, tok, batch_size=16, seed=5)]
    other = [b["input_ids"] for b in build_dataloader(cfg, tok, batch_size=16, seed=6)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_predownload_covers_a_local_epoch(shapes_data):
    local = DataConfig(path=str(shapes_data / "16"))
    assert predownload_for(local) == count_samples(shapes_data / "16")
    assert predownload_for(DataConfig(path="/cache/x", remote="s3://bucket/x")) is None  # Streaming's default
    assert predownload_for(DataConfig(path=str(shapes_data / "16"), predownload=128)) == 128


def test_collate_token_ids_equal_each_caption_and_its_other_phrasing_tokenized_alone(shapes_data, components):
    from transformers import CLIPTokenizer

    from train.data.loader import TokenizingCollate, other_phrasing
    from models.shapes import make_sample

    tok = CLIPTokenizer.from_pretrained(components / "tokenizer")
    samples = []
    for i in range(12):
        s = make_sample(3, "train", i, (16,))
        samples.append({"image": np.asarray(s["images"][16]), "caption": s["caption"], "meta": s["meta"]})
    samples.append(dict(samples[0]))  # a repeated caption
    for s in samples:
        s["caption_alt"] = other_phrasing(s)
    assert any(s["caption_alt"] != s["caption"] for s in samples) and any(s["caption_alt"] == s["caption"] for s in samples)
    batch = TokenizingCollate(tok)(samples)

    def alone(text):
        return tok(text, padding="max_length", truncation=True, max_length=tok.model_max_length,
                   return_tensors="pt").input_ids[0]

    for k, s in enumerate(samples):
        assert torch.equal(batch["input_ids"][k], alone(s["caption"]))
        assert torch.equal(batch["input_ids_alt"][k], alone(s["caption_alt"]))
    # training that never swaps phrasings gets the same captions' ids and no other phrasings
    plain = TokenizingCollate(tok, other_phrasings=False)(samples)
    assert "input_ids_alt" not in plain and torch.equal(plain["input_ids"], batch["input_ids"])
