"""Reading image-caption MDS datasets for training: crop to the phase's resolution, or with aspect-ratio buckets
one Streaming stream per bucket and every global batch from one bucket (``per_stream`` batching); tokenize
captions. Image batches carry SDXL's size and crop conditioning: ``original_size`` (height, width of the source)
and ``crop_top_left`` (top, left of the crop in the resized image's pixels)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from models.common import load_outside
from models.errors import WorkbenchError, first_line

from models.datasets import (StreamConfig, bucket_folders, buckets_of_index, by_aspect, check_safe_columns,
                             count_samples, open_streaming)


def square_crop(img: Image.Image, resolution: int, center_crop: bool = True,
                rng: np.random.Generator | None = None, mode: str = "RGB") -> tuple[np.ndarray, float, tuple[int, int]]:
    """PIL image -> ((R, R, 3) uint8, the scale it was resized by, the crop's (top, left) in the resized image):
    shorter side resized to R, then a square crop. ``mode`` "L": a mask, (R, R), resized by area (its pixels are
    weights: bicubic's overshoot would make them other weights)."""
    img = img.convert(mode)
    w, h = img.size
    scale = 1.0
    if min(w, h) != resolution:
        scale = resolution / min(w, h)
        resample = Image.Resampling.BICUBIC if mode == "RGB" else Image.Resampling.BOX
        img = img.resize((max(resolution, round(w * scale)), max(resolution, round(h * scale))), resample)
        w, h = img.size
    if center_crop or rng is None:
        left, top = (w - resolution) // 2, (h - resolution) // 2
    else:
        left, top = int(rng.integers(0, w - resolution + 1)), int(rng.integers(0, h - resolution + 1))
    if (w, h) != (resolution, resolution):
        img = img.crop((left, top, left + resolution, top + resolution))
    return np.array(img, dtype=np.uint8), scale, (top, left)  # a writable copy


def crop_to_array(img: Image.Image, resolution: int, center_crop: bool = True,
                  rng: np.random.Generator | None = None) -> np.ndarray:
    """PIL image -> (R, R, 3) uint8: shorter side resized to R, then a square crop."""
    return square_crop(img, resolution, center_crop, rng)[0]


def channels_first(pixels: np.ndarray) -> torch.Tensor:
    """(..., R, R, 3) uint8 -> (..., 3, R, R) uint8, a view of the same bytes: what a training batch ships."""
    return torch.from_numpy(np.ascontiguousarray(pixels)).movedim(-1, -3)


def model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float in [-1, 1], where they are (the model calls it on the device: a batch travels as bytes,
    a quarter of float32's)."""
    return images.float().div_(127.5).sub_(1.0)


def to_model_range(pixels: np.ndarray) -> torch.Tensor:
    """(..., R, R, 3) uint8 -> (..., 3, R, R) float in [-1, 1]; one op per batch, not per image
    (each small-tensor op costs ~0.1 ms on CPU, which made per-image conversion half the loader's time)."""
    return model_range(channels_first(pixels))


def image_to_tensor(img: Image.Image, resolution: int, center_crop: bool = True,
                    rng: np.random.Generator | None = None) -> torch.Tensor:
    """PIL image -> (3, R, R) float in [-1, 1]."""
    return to_model_range(crop_to_array(img, resolution, center_crop, rng))


def other_phrasing(sample: dict) -> str:
    """The sample's caption said the other way round, where its ``meta`` lists phrasings (the shapes data:
    "A above B" and "B below A"); the caption itself otherwise."""
    caption, meta = sample["caption"], sample.get("meta")
    phrasings = meta.get("captions") if isinstance(meta, dict) else None
    if isinstance(phrasings, list) and caption in phrasings and len(phrasings) > 1:
        return phrasings[(phrasings.index(caption) + 1) % len(phrasings)]
    return caption


class NamedStreamingDataset(StreamingDataset):
    """A StreamingDataset whose read failures are one line naming its data (``where``).

    Streaming reports a failed download or shard read in a background thread as a logged traceback, and
    the reader then as "RuntimeError: Background thread failed. Check other traceback."; here the thread's
    own error is kept instead and becomes the reader's one-line WorkbenchError.
    """

    def __init__(self, *, where: str, **kwargs):
        self.where = where
        self._failure: BaseException | None = None
        super().__init__(**kwargs)

    def on_exception(self, future) -> None:
        """A background thread's failure: kept for the reader's message and signalled to the other threads
        (Streaming's own re-raises it inside the thread pool, which only logs it)."""
        if future.exception() is not None:
            self._failure = future.exception()
            self._event.set()

    def __getitem__(self, index: int):
        try:
            return super().__getitem__(index)
        except WorkbenchError:
            raise
        except Exception as e:  # noqa: BLE001 - a missing, cut or unreachable shard: one line naming the data
            raise self.read_error(e) from None

    def __iter__(self):
        try:
            yield from super().__iter__()
        except WorkbenchError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self.read_error(e) from None
        if self._failure is not None:  # Streaming ends the epoch early, without a word, when its thread fails
            raise self.read_error(self._failure)

    def read_error(self, e: BaseException) -> WorkbenchError:
        cause = self._failure or e
        return WorkbenchError(f"cannot read {self.where}: {type(cause).__name__}: {first_line(cause)}")


def original_size(sample: dict, stored: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of the sample's source image: its ``original_width``/``original_height`` columns (an
    aspect-ratio conversion's), else ``meta.original_size`` (every conversion records it), else the stored size."""
    if "original_width" in sample and "original_height" in sample:
        return int(sample["original_height"]), int(sample["original_width"])
    meta = sample.get("meta")
    size = meta.get("original_size") if isinstance(meta, dict) else None
    if isinstance(size, list) and len(size) == 2 and all(type(v) is int and v > 0 for v in size):
        return size[1], size[0]
    return stored[1], stored[0]


def stored_crop(sample: dict) -> tuple[int, int]:
    """(top, left) of the crop conversion made, in its resized image's pixels; (0, 0) where it made none."""
    return int(sample.get("crop_top", 0)), int(sample.get("crop_left", 0))


def square_and_crop(sample: dict, resolution: int, center_crop: bool = True,
                    rng: np.random.Generator | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """A sample's square crop, and its top-left in the source as resized for it: a stored crop (an aspect-ratio
    conversion's) scaled with the image, plus the crop made here."""
    pixels, scale, (top, left) = square_crop(sample["image"], resolution, center_crop, rng)
    stored_top, stored_left = stored_crop(sample)
    return pixels, (round(stored_top * scale) + top, round(stored_left * scale) + left)


def center_square(sample: dict, resolution: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """A sample's centre square crop, its source's (height, width) and the crop's (top, left): what an image batch
    carries for SDXL's size and crop conditioning, and `dwb data precompute` stores beside the latents."""
    pixels, crop = square_and_crop(sample, resolution)
    return pixels, original_size(sample, sample["image"].size), crop


class ImageCaptionDataset(NamedStreamingDataset):
    """An MDS image-caption dataset yielding ``{'image': (H, W, 3) uint8, 'caption': str, 'original_size',
    'crop_top_left'}``: a square crop at ``resolution``, or, for a stream whose entry in ``bucket_sizes`` is a
    (width, height), the stored image of that aspect-ratio bucket as it is (no resize, no crop)."""

    def __init__(self, *, resolution: int, center_crop: bool = True, with_ids: bool = False,
                 bucket_sizes: list[tuple[int, int] | None] | None = None, bucket_names: list[str] | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.resolution = resolution
        self.center_crop = center_crop
        self.with_ids = with_ids
        self.bucket_sizes = bucket_sizes  # per stream: its bucket's (width, height), or None for square crops
        self.bucket_names = bucket_names  # per stream: where it is, for a line naming a sample

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index)
        bucket = self.bucket_sizes[self.stream_per_shard[self.spanner[index][0]]] if self.bucket_sizes else None
        image, crop = self.bucket_image(sample, index, bucket) if bucket else self.square(sample, index)
        out = {"image": image, "caption": sample["caption"], "caption_alt": other_phrasing(sample),
               "original_size": original_size(sample, sample["image"].size), "crop_top_left": crop}
        if "mask" in sample:  # a DreamBooth dataset's: cropped as its image, by a generator of the same seed
            out["mask"] = np.array(sample["mask"].convert("L"), dtype=np.uint8) if bucket else \
                square_crop(sample["mask"], self.resolution, self.center_crop, self.crop_rng(index), "L")[0]
        if "prior" in sample:
            out["prior"] = bool(sample["prior"])
        if self.with_ids:
            out["sample_id"] = int(index)
        return out

    def square(self, sample: dict, index: int) -> tuple[np.ndarray, tuple[int, int]]:
        """The square crop, and its top-left in the source as resized for it: a stored crop (an aspect-ratio
        conversion's) scaled with the image, plus the crop made here."""
        return square_and_crop(sample, self.resolution, self.center_crop, self.crop_rng(index))

    def crop_rng(self, index: int) -> np.random.Generator | None:
        """The generator of sample ``index``'s random crop (None: centre crops), the same at each call."""
        return None if self.center_crop else np.random.default_rng([self.shuffle_seed, index])

    def bucket_image(self, sample: dict, index: int, bucket: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
        image = sample["image"]
        if image.size != bucket:
            stream = self.stream_per_shard[self.spanner[index][0]]
            raise WorkbenchError(f"{self.bucket_names[stream]}: sample {index - self.sample_offset_per_stream[stream]} "
                                 f"({sample.get('caption', '')[:60]!r}) is {image.size[0]}x{image.size[1]} px, not its "
                                 f"bucket's {bucket[0]}x{bucket[1]}; convert with `dwb data convert --aspect-buckets`")
        return np.array(image.convert("RGB"), dtype=np.uint8), stored_crop(sample)


class LatentDataset(NamedStreamingDataset):
    """A dataset from `dwb data precompute`: ``{'latent_mean', 'latent_std', 'text'}`` as stored (fp16 or fp32), the
    pooled output and size conditioning where stored."""

    def __init__(self, *, with_ids: bool = False, captions: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.with_ids = with_ids
        self.captions = captions  # the stored captions instead of their text states (a model that encodes its own)

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index)
        out = {"latent_mean": sample["latent_mean"], "latent_std": sample["latent_std"]}
        if self.captions:
            out["caption"] = sample["caption"]
        else:
            out["text"] = sample["text"]
        if "text_alt" in sample and not self.captions:  # latents precomputed before phrasings were stored have none
            out["text_alt"] = sample["text_alt"]
        for key in ("pooled", "pooled_alt") if not self.captions else ():  # where the family conditions on one
            if key in sample:
                out[key] = sample[key]
        for key in ("original_size", "crop_top_left"):  # latents precomputed before sizes were stored have none
            if key in sample:
                out[key] = sample[key]
        if self.with_ids:
            out["sample_id"] = int(index)
        return out


def collate_latents(samples: list[dict], other_phrasings: bool = True) -> dict:
    """Stacks stored latents and text states; ``text_alt`` too where every sample has it and it is wanted."""
    with_alt = other_phrasings and all("text_alt" in s for s in samples)
    keys = ("latent_mean", "latent_std", "text") + (("text_alt",) if with_alt else ())
    optional = ("pooled",) + (("pooled_alt",) if with_alt else ()) + ("original_size", "crop_top_left")
    keys += tuple(k for k in optional if all(k in s for s in samples))  # where stored (latents of older runs: not)
    out = {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in keys}
    if "sample_id" in samples[0]:
        out["sample_id"] = torch.tensor([s["sample_id"] for s in samples])
    return out


def token_ids(tokenizer, texts: list[str], max_length: int | None = None) -> torch.Tensor:
    """(B, max_length) ids of ``texts`` in one call, padded to ``max_length`` (the tokenizer's ``model_max_length``
    unless given) and cut there, as the pipelines tokenize a prompt."""
    return tokenizer(texts, padding="max_length", truncation=True, max_length=max_length or tokenizer.model_max_length,
                     return_tensors="pt").input_ids


class LatentsAndCaptions:
    """Batches stored latents with their captions tokenized in one call (``input_ids``; ``input_ids_2`` too with the
    second tower's own tokenizer): for a model whose text conditioning the stored states do not hold (an MMDiT's
    penultimate states and pooled output)."""

    def __init__(self, tokenizer, tokenizer_2=None, max_length_2: int | None = None):
        self.tokenizer = tokenizer
        self.tokenizer_2, self.max_length_2 = tokenizer_2, max_length_2

    def __call__(self, samples: list[dict]) -> dict:
        out = {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in ("latent_mean", "latent_std")}
        captions = [s["caption"] for s in samples]
        out["input_ids"] = token_ids(self.tokenizer, captions)
        if self.tokenizer_2 is not None:
            out["input_ids_2"] = token_ids(self.tokenizer_2, captions, self.max_length_2)
        if "sample_id" in samples[0]:
            out["sample_id"] = torch.tensor([s["sample_id"] for s in samples])
        return out


class TokenizingCollate:
    """Batches samples: images to (B, 3, H, W) uint8 (the model maps them to [-1, 1] on its device: ``model_range``),
    captions tokenized in one call, and each image's ``original_size`` (height, width) and ``crop_top_left`` (top,
    left) as (B, 2) long tensors.

    ``other_phrasings``: also ``input_ids_alt``, each caption's other phrasing (training that never swaps
    phrasings skips tokenizing them). ``tokenizer_2``: the second text tower's own tokenizer (SDXL's, Flux.1's T5's),
    whose ids of the same texts come as ``input_ids_2`` (and ``input_ids_2_alt``), padded to ``max_length_2``.
    ``prior_loss_weight``, ``masks``: a DreamBooth dataset's loss terms (``loss_terms``).
    """

    def __init__(self, tokenizer, other_phrasings: bool = True, tokenizer_2=None, max_length_2: int | None = None,
                 prior_loss_weight: float = 1.0, masks: bool = True):
        self.tokenizer = tokenizer
        self.other_phrasings = other_phrasings
        self.tokenizer_2, self.max_length_2 = tokenizer_2, max_length_2
        self.prior_loss_weight, self.masks = prior_loss_weight, masks

    def __call__(self, samples: list[dict]) -> dict:
        captions = [s["caption"] for s in samples]
        alts = [s.get("caption_alt") or s["caption"] for s in samples] if self.other_phrasings else []
        unique = list(dict.fromkeys(captions + alts))  # each distinct text once (most have no other phrasing)
        row = {c: i for i, c in enumerate(unique)}
        ids = {"input_ids": token_ids(self.tokenizer, unique)}  # one call per tokenizer
        if self.tokenizer_2 is not None:
            ids["input_ids_2"] = token_ids(self.tokenizer_2, unique, self.max_length_2)
        out = {"image": channels_first(np.stack([s["image"] for s in samples])),
               **{key: table[[row[c] for c in captions]] for key, table in ids.items()}}
        for key in ("original_size", "crop_top_left"):  # SDXL's size and crop conditioning, (B, 2) each
            if key in samples[0]:
                out[key] = torch.tensor([s[key] for s in samples], dtype=torch.long)
        if alts:
            out.update({f"{key}_alt": table[[row[c] for c in alts]] for key, table in ids.items()})
        if "sample_id" in samples[0]:
            out["sample_id"] = torch.tensor([s["sample_id"] for s in samples])
        return {**out, **loss_terms(samples, self.prior_loss_weight, self.masks)}


def loss_terms(samples: list[dict], prior_loss_weight: float, masks: bool) -> dict:
    """A DreamBooth batch's terms of the loss (``LatentDiffusion.loss``), where its samples carry them (a mixture's
    other datasets do not): ``loss_weight`` (B,) float32, ``prior_loss_weight`` for a class image and 1 for the
    others; with ``masks``, ``mask`` (B, 1, H, W) uint8, each pixel's weight (255: full; a sample without one all
    255)."""
    out = {}
    if any("prior" in s for s in samples):
        out["loss_weight"] = torch.tensor([prior_loss_weight if s.get("prior") else 1.0 for s in samples],
                                          dtype=torch.float32)
    if masks and any("mask" in s for s in samples):
        full = np.full(samples[0]["image"].shape[:2], 255, dtype=np.uint8)
        out["mask"] = torch.from_numpy(np.stack([s.get("mask", full) for s in samples]))[:, None]
    return out


def fast_tokenizer(tokenizer):
    """The Rust tokenizer with the same vocabulary, for data loading (same ids, several times faster): a fast
    tokenizer (T5's) as it is, a CLIP one converted."""
    import tempfile

    from transformers import CLIPTokenizerFast

    if tokenizer is None or getattr(tokenizer, "is_fast", False):
        return tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return CLIPTokenizerFast.from_pretrained(tmp)


def stream_list(data_cfg) -> list:
    """The datasets to read: ``data.streams``, or the one ``data.path``/``data.remote``."""
    return list(data_cfg.streams) or [StreamConfig(path=data_cfg.path, remote=data_cfg.remote)]


def predownload_for(data_cfg) -> int | None:
    """Local data: the whole epoch (the background threads run ahead once and exit). Remote: Streaming's default."""
    if data_cfg.predownload is not None:
        return data_cfg.predownload
    streams = stream_list(data_cfg)
    if any(s.remote for s in streams):
        return None
    return sum(count_samples(s.path) for s in streams)


def check_remote_access(url: str, key: str) -> None:
    """A remote without credentials fails now with one line, not deep inside a download thread."""
    if not url.startswith("s3://"):
        return
    import boto3

    if boto3.session.Session().get_credentials() is None:
        raise WorkbenchError(f"config key '{key}': {url} needs S3 credentials, and none were found (set "
                             f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; S3_ENDPOINT_URL for "
                             f"an S3-compatible store)")


def _check_local(path: str, key: str, precomputed: bool) -> None:
    from .latents import META

    p = Path(path)
    try:
        n = count_samples(p)  # the index checked against the shards, before any sample is read
    except WorkbenchError as e:
        raise WorkbenchError(f"config key '{key}': {e}") from None
    if n == 0:
        raise WorkbenchError(f"config key '{key}': the dataset at {p} is empty")
    if (p / META).is_file() and not precomputed:
        raise WorkbenchError(f"config key '{key}': {p} holds precomputed latents; set data.precomputed=true")
    if precomputed and not (p / META).is_file():
        raise WorkbenchError(f"config key '{key}': {p} holds images, not precomputed latents; set "
                             f"data.precomputed=false or run `dwb data precompute`")


def latent_meta(data_cfg) -> dict:
    """The precompute metadata every stream of a latent dataset shares (refused if they differ)."""
    from .latents import read_meta

    metas = []
    for i, s in enumerate(stream_list(data_cfg)):
        meta = read_meta(s.path, s.remote)
        key = f"data.streams[{i}]" if data_cfg.streams else "data.path"
        for field in ("scaling_factor", "latent_shape", "text_shape", "resolution"):
            if metas and meta[field] != metas[0][field]:
                raise WorkbenchError(f"config key '{key}': its latents differ from the first stream's in {field} "
                                     f"({meta[field]} vs {metas[0][field]})")
        for part in ("vae", "text_encoder"):
            if metas and meta[part]["fingerprint"] != metas[0][part]["fingerprint"]:
                raise WorkbenchError(f"config key '{key}': its latents were made with another {part.replace('_', ' ')} "
                                     f"than the first stream's")
        metas.append(meta)
    return metas[0]


SHARED_MEMORY = Path("/dev/shm")  # where Linux keeps POSIX shared memory, Streaming's per-node state


def check_node_shared_memory() -> None:
    """Several nodes of one run must not share ``/dev/shm``: Streaming keeps each node's sample partition, locks
    and cache in shared memory named per dataset, so two "nodes" on one machine (or sharing a host's /dev/shm in
    containers) take each other's state, and a rank waited 300 s and failed with "cannot open the training data",
    which named the wrong cause. Each node's first process leaves a mark there; seeing another node's mark is one
    line saying what is wrong. Every rank joins (two barriers and a broadcast), once, before the data opens."""
    from composer.utils import dist

    from models.common import barrier, broadcast_object

    nodes = dist.get_world_size() // dist.get_local_world_size()
    if nodes < 2 or not SHARED_MEMORY.is_dir():
        return
    token = broadcast_object(os.urandom(6).hex() if dist.get_global_rank() == 0 else None)
    mark = SHARED_MEMORY / f"dwb-node-{token}-{dist.get_node_rank()}"
    if dist.get_local_rank() == 0:
        mark.touch()
    barrier()
    shared = sorted(n for n in range(nodes)
                    if n != dist.get_node_rank() and (SHARED_MEMORY / f"dwb-node-{token}-{n}").exists())
    barrier()
    if dist.get_local_rank() == 0:
        mark.unlink(missing_ok=True)
    if shared:
        raise WorkbenchError(f"node {dist.get_node_rank()} shares {SHARED_MEMORY} with node {shared[0]}: Streaming keeps "
                             f"each node's state there, so every node needs its own (separate machines, or a private "
                             f"mount namespace with a tmpfs on {SHARED_MEMORY}: docs/scale.md)")


@dataclass(frozen=True)
class BucketStream:
    """One Streaming stream of bucketed training data: an aspect-ratio bucket of a configured dataset (``bucket``
    its width and height), or a dataset without buckets, read in square crops (``bucket`` None); ``samples``: the
    samples it holds; its share of the dataset's proportion, repeat or choose."""
    path: str | None
    remote: str | None
    bucket: tuple[int, int] | None
    where: str
    samples: int
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None


def stream_key(data_cfg, i: int) -> str:
    return f"data.streams[{i}]" if data_cfg.streams else "data.path"


def remote_index(remote: str, key: str) -> dict:
    """A remote dataset's index, fetched as Streaming fetches it."""
    import tempfile

    from streaming.base.storage.download import CloudDownloader

    with tempfile.TemporaryDirectory() as tmp:
        try:
            CloudDownloader.direct_download(f"{remote.rstrip('/')}/index.json", f"{tmp}/index.json", 60)
        except Exception as e:  # noqa: BLE001 - unreachable, missing, refused: one line naming the remote
            raise WorkbenchError(f"cannot open the training data ({remote}): {first_line(e)}") from None
        index = load_outside(Path(tmp) / "index.json", f"{remote}/index.json")
    if not (isinstance(index, dict) and isinstance(index.get("shards"), list)):
        raise WorkbenchError(f"config key '{key}': {remote}/index.json is not an MDS index")
    return index


def buckets_and_samples(stream: StreamConfig, key: str) -> tuple[dict[tuple[int, int], int], int]:
    """A configured dataset's aspect-ratio buckets with their samples ({} for a dataset without), and its samples."""
    if not stream.remote:
        try:
            buckets = bucket_folders(stream.path)
        except WorkbenchError as e:
            raise WorkbenchError(f"config key '{key}': {e}") from None
        return buckets, sum(buckets.values()) if buckets else count_samples(stream.path)
    index = remote_index(stream.remote, key)
    try:
        buckets = dict(sorted(buckets_of_index(index).items(), key=lambda b: by_aspect(b[0])))
        return buckets, sum(int(shard["samples"]) for shard in index["shards"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise WorkbenchError(f"config key '{key}': {stream.remote}/index.json is unreadable "
                             f"({first_line(e)})") from None


def check_budget(stream: StreamConfig, buckets, resolution: int, key: str) -> None:
    """The phase's resolution is the buckets' budget: the folder's name as conversion writes it (``OUT/512``), or
    its square bucket; at least no bucket holds more pixels than resolution x resolution."""
    name = (stream.remote or stream.path).rstrip("/").rsplit("/", 1)[-1]
    square = [w for w, h in buckets if w == h]
    budget = int(name) if name.isdigit() else square[0] if square else None
    if budget is not None and budget != resolution:
        raise WorkbenchError(f"config key '{key}': its aspect-ratio buckets are of the budget {budget} x {budget} px, "
                             f"but data.resolution is {resolution}; set data.resolution={budget} (or "
                             f"data.aspect_buckets=false for square crops at {resolution})")
    if budget is None and (over := [b for b in buckets if b[0] * b[1] > resolution ** 2]):
        raise WorkbenchError(f"config key '{key}': its bucket {over[0][0]}x{over[0][1]} holds more pixels than "
                             f"data.resolution {resolution} squared")


def split_stream(stream: StreamConfig, buckets: dict[tuple[int, int], int], where: str) -> list[BucketStream]:
    """A dataset's buckets as streams, its proportion and choose shared by their samples, its repeat in each."""
    total = sum(buckets.values())
    chooses = None
    if stream.choose is not None:  # whole samples, the remainder to the first buckets: they sum to the choose
        chooses = [stream.choose * n // total for n in buckets.values()]
        for i in range(stream.choose - sum(chooses)):
            chooses[i % len(chooses)] += 1
    out = []
    for i, (bucket, n) in enumerate(buckets.items()):
        name = f"{bucket[0]}x{bucket[1]}"
        path = str(Path(stream.path) / name) if stream.path else None
        remote = f"{stream.remote.rstrip('/')}/{name}" if stream.remote else None
        out.append(BucketStream(path, remote, bucket, f"{where} {name}", n,
                                stream.proportion * n / total if stream.proportion is not None else None,
                                stream.repeat, chooses[i] if chooses else None))
    return out


def per_epoch(streams: list[BucketStream]) -> list[int]:
    """Samples each stream gives per epoch, as Streaming weighs them (``Stream.apply_weights``)."""
    if any(s.proportion is not None for s in streams):
        total, weight = sum(s.samples for s in streams), sum(s.proportion or 0 for s in streams)
        return [int(total * (s.proportion or 0) / weight) for s in streams]
    return [int(s.repeat * s.samples) if s.repeat is not None else s.choose if s.choose is not None else s.samples
            for s in streams]


def bucket_streams(data_cfg, global_batch: int) -> list[BucketStream] | None:
    """The streams of a config whose data holds aspect-ratio buckets (``data.aspect_buckets``): one per bucket
    (per dataset x bucket for a mixture), less the buckets that give fewer samples per epoch than one global
    batch (Streaming's ``per_stream`` batching refuses those), said in one line from rank 0; None for other data."""
    from composer.utils import dist

    if not data_cfg.aspect_buckets or data_cfg.precomputed:
        return None
    found = [(s, *buckets_and_samples(s, stream_key(data_cfg, i))) for i, s in enumerate(stream_list(data_cfg))]
    if not any(buckets for _, buckets, _ in found):
        return None
    streams = []
    for i, (s, buckets, samples) in enumerate(found):
        key, where = stream_key(data_cfg, i), s.remote or s.path
        if buckets:
            check_budget(s, buckets, data_cfg.resolution, key)
            streams += split_stream(s, buckets, where)
        else:
            streams.append(BucketStream(s.path or None, s.remote, None, where, samples, s.proportion, s.repeat,
                                        s.choose))
    counts = per_epoch(streams)
    kept = [s for s, n in zip(streams, counts) if n >= global_batch]
    left = [(s, n) for s, n in zip(streams, counts) if n < global_batch]
    if not kept:
        raise WorkbenchError(f"no aspect-ratio bucket of the training data gives one global batch of {global_batch} "
                             f"per epoch (the largest gives {max(counts)}); lower global_train_batch_size, or set "
                             f"data.aspect_buckets=false")
    if left and dist.get_global_rank() == 0:
        print(f"aspect buckets: left out {sum(n for _, n in left)} images of {len(left)} buckets that give fewer than "
              f"one global batch ({global_batch}) per epoch: " + ", ".join(f"{s.where} {n}" for s, n in left),
              flush=True)
    return kept


def make_dataset(data_cfg, batch_size: int, seed: int, with_ids: bool = False, captions: bool = False) -> StreamingDataset:
    """The Streaming dataset of a data config: one dataset or a mixture of streams, images or latents; with
    aspect-ratio buckets one stream per bucket, every global batch from one (``per_stream`` batching)."""
    from composer.utils import dist
    from streaming import Stream

    streams = stream_list(data_cfg)
    for i, s in enumerate(streams):
        key = f"data.streams[{i}]" if data_cfg.streams else "data"
        if s.remote:
            check_remote_access(s.remote, f"{key}.remote" if data_cfg.streams else "data.remote")
        else:
            _check_local(s.path, f"{key}.path" if data_cfg.streams else "data.path", data_cfg.precomputed)
    if data_cfg.precomputed and not data_cfg.center_crop:
        raise WorkbenchError("config key 'data.center_crop': precomputed latents were cropped when they were made; "
                             "random crops need data.precomputed=false")
    common = dict(shuffle=data_cfg.shuffle, shuffle_seed=seed, shuffle_algo=data_cfg.shuffle_algo,
                  num_canonical_nodes=data_cfg.num_canonical_nodes, batch_size=batch_size,
                  predownload=predownload_for(data_cfg))
    where = f"the training data ({', '.join(s.remote or s.path for s in streams)})"
    images = {}
    if (buckets := bucket_streams(data_cfg, batch_size * dist.get_world_size())) is not None:
        # Streaming warns, per bucket and epoch, that the bucket's last partial global batch is dropped: here that
        # is the design (docs/data.md), 5 to 13 lines an epoch that would bury the run's own
        logging.getLogger("streaming.base.batching.per_stream").setLevel(logging.ERROR)
        common.update(streams=[dict(local=b.path, remote=b.remote, proportion=b.proportion, repeat=b.repeat,
                                    choose=b.choose) for b in buckets], batching_method="per_stream")
        images = dict(bucket_sizes=[b.bucket for b in buckets], bucket_names=[b.where for b in buckets])
    elif data_cfg.streams:
        common["streams"] = [dict(local=s.path or None, remote=s.remote, proportion=s.proportion, repeat=s.repeat,
                                  choose=s.choose) for s in streams]
    else:
        common.update(local=data_cfg.path or None, remote=data_cfg.remote)
    check_node_shared_memory()

    def opened():
        """The dataset, with Streams of its own: Streaming writes each stream's weights into it as it opens, and
        a Stream weighed once is refused by the next open (after another process took the shared-memory name)."""
        fresh = {**common, "streams": [Stream(**a) for a in common["streams"]]} if "streams" in common else common
        if data_cfg.precomputed:
            return LatentDataset(with_ids=with_ids, captions=captions, where=where, **fresh)
        return ImageCaptionDataset(resolution=data_cfg.resolution, center_crop=data_cfg.center_crop,
                                   with_ids=with_ids, where=where, **images, **fresh)

    try:
        dataset = open_streaming(opened)
        check_safe_columns(dataset, "config key 'data.path'" if not data_cfg.streams else "config key 'data.streams'")
        return dataset
    except WorkbenchError:
        raise
    except Exception as e:  # noqa: BLE001 - storage and index errors become one line naming the data
        raise WorkbenchError(f"cannot open {where}: {first_line(e)}") from None


def build_dataloader(data_cfg, tokenizer, batch_size: int, seed: int, drop_last: bool = True,
                     with_ids: bool = False, other_phrasings: bool = True, captions: bool = False,
                     tokenizer_2=None, max_length_2: int | None = None, pin_memory: bool = False) -> DataLoader:
    """``other_phrasings``: batches carry each caption's other phrasing too (``model.other_phrasing`` > 0);
    ``captions``: precomputed latents come with their captions' token ids instead of stored text states;
    ``tokenizer_2``: the second text tower's own tokenizer, its ids as ``input_ids_2`` padded to ``max_length_2``;
    ``pin_memory``: batches in page-locked memory (training on a GPU), which Composer's non-blocking copy to the
    device then overlaps with the step instead of waiting for it."""
    if (captions or not data_cfg.precomputed) and tokenizer is None:
        raise WorkbenchError("training on captions needs a tokenizer: set model.pretrained to a folder with tokenizer/")
    dataset = make_dataset(data_cfg, batch_size, seed, with_ids=with_ids, captions=captions)
    if data_cfg.precomputed:
        collate = (LatentsAndCaptions(fast_tokenizer(tokenizer), fast_tokenizer(tokenizer_2), max_length_2) if captions
                   else partial(collate_latents, other_phrasings=other_phrasings))
    else:
        collate = TokenizingCollate(fast_tokenizer(tokenizer), other_phrasings=other_phrasings,
                                    tokenizer_2=fast_tokenizer(tokenizer_2), max_length_2=max_length_2,
                                    prior_loss_weight=data_cfg.prior_loss_weight, masks=data_cfg.masked_loss)
    return DataLoader(dataset, batch_size=batch_size, num_workers=data_cfg.num_workers, drop_last=drop_last,
                      collate_fn=collate, persistent_workers=data_cfg.num_workers > 0, pin_memory=pin_memory)
