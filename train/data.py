"""Reading image-caption MDS datasets for training: crop to the phase's resolution, tokenize captions."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from .errors import WorkbenchError
from .mds import count_samples


def crop_to_array(img: Image.Image, resolution: int, center_crop: bool = True,
                  rng: np.random.Generator | None = None) -> np.ndarray:
    """PIL image -> (R, R, 3) uint8: shorter side resized to R, then a square crop."""
    img = img.convert("RGB")
    w, h = img.size
    if min(w, h) != resolution:
        scale = resolution / min(w, h)
        img = img.resize((max(resolution, round(w * scale)), max(resolution, round(h * scale))), Image.Resampling.BICUBIC)
        w, h = img.size
    if center_crop or rng is None:
        left, top = (w - resolution) // 2, (h - resolution) // 2
    else:
        left, top = int(rng.integers(0, w - resolution + 1)), int(rng.integers(0, h - resolution + 1))
    if (w, h) != (resolution, resolution):
        img = img.crop((left, top, left + resolution, top + resolution))
    return np.array(img, dtype=np.uint8)  # a writable copy


def to_model_range(pixels: np.ndarray) -> torch.Tensor:
    """(..., R, R, 3) uint8 -> (..., 3, R, R) float in [-1, 1]; one op per batch, not per image
    (each small-tensor op costs ~0.1 ms on CPU, which made per-image conversion half the loader's time)."""
    return torch.from_numpy(np.ascontiguousarray(pixels)).movedim(-1, -3).float().div_(127.5).sub_(1.0)


def image_to_tensor(img: Image.Image, resolution: int, center_crop: bool = True,
                    rng: np.random.Generator | None = None) -> torch.Tensor:
    """PIL image -> (3, R, R) float in [-1, 1]."""
    return to_model_range(crop_to_array(img, resolution, center_crop, rng))


class ImageCaptionDataset(StreamingDataset):
    """An MDS image-caption dataset yielding ``{'image': (R, R, 3) uint8, 'caption': str}``."""

    def __init__(self, *, local: str, remote: str | None = None, resolution: int, center_crop: bool = True, **kwargs):
        super().__init__(local=local, remote=remote, **kwargs)
        self.resolution = resolution
        self.center_crop = center_crop

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index)
        rng = None if self.center_crop else np.random.default_rng([self.shuffle_seed, index])
        return {"image": crop_to_array(sample["image"], self.resolution, self.center_crop, rng),
                "caption": sample["caption"]}


class TokenizingCollate:
    """Batches samples: images to (B, 3, R, R) in [-1, 1] and captions tokenized in one call each."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, samples: list[dict]) -> dict:
        ids = self.tokenizer([s["caption"] for s in samples], padding="max_length", truncation=True,
                             max_length=self.tokenizer.model_max_length, return_tensors="pt").input_ids
        return {"image": to_model_range(np.stack([s["image"] for s in samples])), "input_ids": ids}


def fast_tokenizer(tokenizer):
    """The Rust tokenizer with the same vocabulary, for data loading (same ids, several times faster)."""
    import tempfile

    from transformers import CLIPTokenizerFast

    if isinstance(tokenizer, CLIPTokenizerFast):
        return tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return CLIPTokenizerFast.from_pretrained(tmp)


def predownload_for(data_cfg) -> int | None:
    """Local data: the whole epoch (the background threads run ahead once and exit). Remote: Streaming's default."""
    if data_cfg.predownload is not None:
        return data_cfg.predownload
    return None if data_cfg.remote else count_samples(data_cfg.path)


def build_dataloader(data_cfg, tokenizer, batch_size: int, seed: int, drop_last: bool = True) -> DataLoader:
    if data_cfg.remote is None:
        path = Path(data_cfg.path)
        if not (path / "index.json").is_file():
            raise WorkbenchError(f"config key 'data.path': no MDS dataset at {path} (index.json missing)")
        if count_samples(path) == 0:
            raise WorkbenchError(f"config key 'data.path': the dataset at {path} is empty")
    if tokenizer is None:
        raise WorkbenchError("training on captions needs a tokenizer: set model.pretrained to a folder with tokenizer/")
    dataset = ImageCaptionDataset(
        local=data_cfg.path, remote=data_cfg.remote, resolution=data_cfg.resolution, center_crop=data_cfg.center_crop,
        shuffle=data_cfg.shuffle, shuffle_seed=seed, batch_size=batch_size, predownload=predownload_for(data_cfg),
    )
    return DataLoader(dataset, batch_size=batch_size, num_workers=data_cfg.num_workers, drop_last=drop_last,
                      collate_fn=TokenizingCollate(fast_tokenizer(tokenizer)),
                      persistent_workers=data_cfg.num_workers > 0)
