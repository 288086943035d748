"""Reading image-caption MDS datasets for training: crop to the phase's resolution, tokenize captions."""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from ..errors import WorkbenchError, first_line
from .mds import StreamConfig, check_safe_columns, count_samples, open_streaming


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


class ImageCaptionDataset(NamedStreamingDataset):
    """An MDS image-caption dataset yielding ``{'image': (R, R, 3) uint8, 'caption': str}``."""

    def __init__(self, *, resolution: int, center_crop: bool = True, with_ids: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.resolution = resolution
        self.center_crop = center_crop
        self.with_ids = with_ids

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index)
        rng = None if self.center_crop else np.random.default_rng([self.shuffle_seed, index])
        out = {"image": crop_to_array(sample["image"], self.resolution, self.center_crop, rng),
               "caption": sample["caption"], "caption_alt": other_phrasing(sample)}
        if self.with_ids:
            out["sample_id"] = int(index)
        return out


class LatentDataset(NamedStreamingDataset):
    """A dataset from `dwb data precompute`: ``{'latent_mean', 'latent_std', 'text'}`` as stored (fp16 or fp32)."""

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
        if self.with_ids:
            out["sample_id"] = int(index)
        return out


def collate_latents(samples: list[dict], other_phrasings: bool = True) -> dict:
    """Stacks stored latents and text states; ``text_alt`` too where every sample has it and it is wanted."""
    with_alt = other_phrasings and all("text_alt" in s for s in samples)
    keys = ("latent_mean", "latent_std", "text") + (("text_alt",) if with_alt else ())
    out = {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in keys}
    if "sample_id" in samples[0]:
        out["sample_id"] = torch.tensor([s["sample_id"] for s in samples])
    return out


class LatentsAndCaptions:
    """Batches stored latents with their captions tokenized in one call (``input_ids``): for a model whose text
    conditioning the stored states do not hold (an MMDiT's penultimate states and pooled output)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, samples: list[dict]) -> dict:
        out = {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in ("latent_mean", "latent_std")}
        out["input_ids"] = self.tokenizer([s["caption"] for s in samples], padding="max_length", truncation=True,
                                          max_length=self.tokenizer.model_max_length, return_tensors="pt").input_ids
        if "sample_id" in samples[0]:
            out["sample_id"] = torch.tensor([s["sample_id"] for s in samples])
        return out


class TokenizingCollate:
    """Batches samples: images to (B, 3, R, R) in [-1, 1] and captions tokenized in one call.

    ``other_phrasings``: also ``input_ids_alt``, each caption's other phrasing (training that never swaps
    phrasings skips tokenizing them).
    """

    def __init__(self, tokenizer, other_phrasings: bool = True):
        self.tokenizer = tokenizer
        self.other_phrasings = other_phrasings

    def __call__(self, samples: list[dict]) -> dict:
        captions = [s["caption"] for s in samples]
        alts = [s.get("caption_alt") or s["caption"] for s in samples] if self.other_phrasings else []
        unique = list(dict.fromkeys(captions + alts))  # each distinct text once (most have no other phrasing)
        ids = self.tokenizer(unique, padding="max_length", truncation=True,
                             max_length=self.tokenizer.model_max_length, return_tensors="pt").input_ids
        row = {c: i for i, c in enumerate(unique)}
        out = {"image": to_model_range(np.stack([s["image"] for s in samples])), "input_ids": ids[[row[c] for c in captions]]}
        if alts:
            out["input_ids_alt"] = ids[[row[c] for c in alts]]
        if "sample_id" in samples[0]:
            out["sample_id"] = torch.tensor([s["sample_id"] for s in samples])
        return out


def fast_tokenizer(tokenizer):
    """The Rust tokenizer with the same vocabulary, for data loading (same ids, several times faster)."""
    import tempfile

    from transformers import CLIPTokenizerFast

    if isinstance(tokenizer, CLIPTokenizerFast):
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

    nodes = dist.get_world_size() // dist.get_local_world_size()
    if nodes < 2 or not SHARED_MEMORY.is_dir():
        return
    token = [os.urandom(6).hex() if dist.get_global_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    mark = SHARED_MEMORY / f"dwb-node-{token[0]}-{dist.get_node_rank()}"
    if dist.get_local_rank() == 0:
        mark.touch()
    dist.barrier()
    shared = sorted(n for n in range(nodes)
                    if n != dist.get_node_rank() and (SHARED_MEMORY / f"dwb-node-{token[0]}-{n}").exists())
    dist.barrier()
    if dist.get_local_rank() == 0:
        mark.unlink(missing_ok=True)
    if shared:
        raise WorkbenchError(f"node {dist.get_node_rank()} shares {SHARED_MEMORY} with node {shared[0]}: Streaming keeps "
                             f"each node's state there, so every node needs its own (separate machines, or a private "
                             f"mount namespace with a tmpfs on {SHARED_MEMORY}: docs/scale.md)")


def make_dataset(data_cfg, batch_size: int, seed: int, with_ids: bool = False, captions: bool = False) -> StreamingDataset:
    """The Streaming dataset of a data config: one dataset or a mixture of streams, images or latents."""
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
    if data_cfg.streams:
        common["streams"] = [Stream(local=s.path or None, remote=s.remote, proportion=s.proportion, repeat=s.repeat,
                                    choose=s.choose) for s in streams]
    else:
        common.update(local=data_cfg.path or None, remote=data_cfg.remote)
    where = f"the training data ({', '.join(s.remote or s.path for s in streams)})"
    check_node_shared_memory()
    try:
        dataset = open_streaming(lambda: LatentDataset(with_ids=with_ids, captions=captions, where=where, **common) if data_cfg.precomputed
                                 else ImageCaptionDataset(resolution=data_cfg.resolution, center_crop=data_cfg.center_crop,
                                                          with_ids=with_ids, where=where, **common))
        check_safe_columns(dataset, "config key 'data.path'" if not data_cfg.streams else "config key 'data.streams'")
        return dataset
    except WorkbenchError:
        raise
    except Exception as e:  # noqa: BLE001 - storage and index errors become one line naming the data
        raise WorkbenchError(f"cannot open {where}: {first_line(e)}") from None


def build_dataloader(data_cfg, tokenizer, batch_size: int, seed: int, drop_last: bool = True,
                     with_ids: bool = False, other_phrasings: bool = True, captions: bool = False) -> DataLoader:
    """``other_phrasings``: batches carry each caption's other phrasing too (``model.other_phrasing`` > 0);
    ``captions``: precomputed latents come with their captions' token ids instead of stored text states."""
    if (captions or not data_cfg.precomputed) and tokenizer is None:
        raise WorkbenchError("training on captions needs a tokenizer: set model.pretrained to a folder with tokenizer/")
    dataset = make_dataset(data_cfg, batch_size, seed, with_ids=with_ids, captions=captions)
    if data_cfg.precomputed:
        collate = (LatentsAndCaptions(fast_tokenizer(tokenizer)) if captions
                   else partial(collate_latents, other_phrasings=other_phrasings))
    else:
        collate = TokenizingCollate(fast_tokenizer(tokenizer), other_phrasings=other_phrasings)
    return DataLoader(dataset, batch_size=batch_size, num_workers=data_cfg.num_workers, drop_last=drop_last,
                      collate_fn=collate, persistent_workers=data_cfg.num_workers > 0)
