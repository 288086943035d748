"""`dwb data precompute SRC OUT`: encode an image-caption MDS dataset once with the frozen VAE and text encoder.

Training then skips both encoders at every step. For each resolution bucket the output is a new MDS
dataset (``OUT/<side>``) with the columns

- ``latent_mean``, ``latent_std``: the VAE posterior of the centre-cropped image, both already
  multiplied by the VAE's ``scaling_factor`` (applied here, exactly once). Training samples
  ``mean + std * eps`` at every step, so it sees the same distribution as on-the-fly encoding;
- ``text``, ``text_alt``: the text conditioning's per-token states of the caption and of its other phrasing
  (what the denoiser attends to), and ``pooled``, ``pooled_alt`` their pooled output where the family conditions
  on one;
- ``original_size``, ``crop_top_left``: the source image's (height, width) and the crop's (top, left), as an image
  batch carries them (SDXL's size and crop conditioning);
- ``caption``: the caption itself;

and ``precompute.json`` with the scaling factor, fingerprints of the VAE's and each text tower's weights (training
refuses latents made with other weights), the crop, the shapes, and the empty caption's states and pooled output:
caption dropout substitutes them at train time, so which captions are dropped stays random at every step instead of
being frozen into the dataset.

What is encoded is what the run's model encodes: with ``--config`` the run's own Composer model is built with its
denoiser on the meta device (``train.recipes.frozen_model``) and its ``encode_captions`` gives the states and pooled
output (SDXL: both towers' penultimate states side by side and the second's pooled output; Flux.1: T5's states over
``model.text_tokens`` and CLIP's pooled output). With ``--pretrained`` (or ``--vae`` and ``--text-encoder``) one
CLIP tower's last hidden states are stored, as SD 1/2 read them (``OneTower``).

Work is split into chunks of consecutive samples; under ``composer -n N`` each rank encodes every
N-th chunk. A chunk is finished when its ``index.json`` exists, so an interrupted run restarted
with the same command redoes only unfinished chunks. The merged ``index.json`` lists the chunks in
order, so the output's sample order is the source's whatever the number of ranks.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from models.errors import WorkbenchError, first_line
from models.checkpoints import fingerprint

from .latents import LATENTS_FORMAT, META, STORAGE_DTYPES, encode_array, latent_columns

# ---------------------------------------------------------------------------------------------
# Loading the encoders


@dataclass(frozen=True)
class EncodedText:
    """Captions' per-token states (B, L, D) and pooled output (B, P) or None (``train.recipes.TextConditioning``'s)."""
    states: torch.Tensor
    pooled: torch.Tensor | None = None


class OneTower:
    """SD 1/2's text conditioning from parts named by path: one CLIP tower's last hidden states, no pooled output, as
    ``train.recipes.LatentDiffusion.encode_text`` builds them; the interface a run's model offers (``family``,
    ``frozen_components``, ``encode_captions``)."""

    family = "sd2"  # the conditioning SD 1 and 2 share (``LatentDiffusion.family``)

    def __init__(self, vae, text_encoder, tokenizer):
        self.vae, self.text_encoder, self.tokenizer = vae, text_encoder, tokenizer

    def frozen_components(self) -> dict:
        return {"vae": self.vae, "text_encoder": self.text_encoder}

    @torch.no_grad()
    def encode_captions(self, captions: list[str], device=None) -> EncodedText:
        from .loader import token_ids

        return EncodedText(self.text_encoder(token_ids(self.tokenizer, captions).to(device))[0])


def load_encoders(vae_ref: str, text_encoder_ref: str, tokenizer_ref: str | None):
    from diffusers import AutoencoderKL
    from transformers import CLIPTextModel, CLIPTokenizer

    from models.checkpoints import load_part

    vae = load_part(AutoencoderKL, vae_ref, "vae", "VAE")
    text_encoder = load_part(CLIPTextModel, text_encoder_ref, "text_encoder", "text encoder")
    if tokenizer_ref is None:  # next to the text encoder: ROOT/tokenizer, or a sibling of ROOT/text_encoder
        p = Path(text_encoder_ref)
        tokenizer_ref = str(p.parent) if (p / "config.json").is_file() else text_encoder_ref
    tokenizer = load_part(CLIPTokenizer, tokenizer_ref, "tokenizer", "tokenizer")
    return vae.eval().requires_grad_(False), text_encoder.eval().requires_grad_(False), tokenizer


# ---------------------------------------------------------------------------------------------
# Encoding


@torch.no_grad()
def encode_batch(encoder, pixels: torch.Tensor, captions: list[str]):
    """(B, 3, R, R) in [-1, 1] and captions -> scaled posterior mean and std, and the captions' ``EncodedText``
    (``encoder``: a run's model or ``OneTower``)."""
    vae = encoder.vae
    device = next(vae.parameters()).device
    posterior = vae.encode(pixels.to(device)).latent_dist
    sf = float(vae.config.scaling_factor)
    text = encoder.encode_captions(captions, device)
    return posterior.mean * sf, posterior.std * sf, EncodedText(text.states, text.pooled)


def part_fingerprints(part: torch.nn.Module) -> dict[str, str]:
    """The fingerprints of a frozen part as training holds it in each dtype (``models.checkpoints.hold_in``'s rule):
    float32 on a CPU, bfloat16 or float16 under a GPU's autocast."""
    return {str(dtype).removeprefix("torch."): fingerprint(part, dtype)
            for dtype in (torch.float32, torch.bfloat16, torch.float16)}


def _sources(src: str, resolutions: list[int] | None, cache: str | None) -> list[tuple[int, str, str | None]]:
    """(side, local folder, remote) per bucket to encode."""
    from models.datasets import bucket_dirs

    if "://" in src:
        if not resolutions or len(resolutions) != 1:
            raise WorkbenchError("a remote SRC is one dataset: give its --resolution once")
        return [(resolutions[0], cache or "", src)]
    root = Path(src)
    if not root.exists():
        raise WorkbenchError(f"source dataset not found: {src}")
    if (root / "index.json").is_file():
        if not resolutions or len(resolutions) != 1:
            raise WorkbenchError(f"{src} is one MDS dataset: give the --resolution to crop it to")
        _refuse_aspect_buckets(str(root))
        return [(resolutions[0], str(root), None)]
    buckets = bucket_dirs(root)
    if not buckets:
        raise WorkbenchError(f"{src} holds neither an MDS dataset (index.json) nor resolution buckets (256/, 512/ ...)")
    wanted = resolutions or sorted(buckets)
    missing = [r for r in wanted if r not in buckets]
    if missing:
        raise WorkbenchError(f"{src} has no bucket {', '.join(map(str, missing))} (it has {', '.join(map(str, sorted(buckets)))})")
    jobs = [(r, str(buckets[r]), None) for r in wanted]
    for _, local, _ in jobs:
        _refuse_aspect_buckets(local)
    return jobs


def _refuse_aspect_buckets(folder: str) -> None:
    """Latents are stored centre-cropped to one square side: a dataset of aspect-ratio buckets would lose the
    buckets, and its size and crop conditioning, without a word."""
    from models.datasets import bucket_folders

    if bucket_folders(folder):
        raise WorkbenchError(f"{folder} holds aspect-ratio buckets (`dwb data convert --aspect-buckets`), which "
                             f"precomputed latents do not keep yet; train on its images instead")


def _merge_chunks(out: Path, chunk_dirs: list[Path]) -> int:
    """One index.json over the chunks' shards, in chunk order."""
    shards = []
    for d in chunk_dirs:
        for shard in json.loads((d / "index.json").read_text())["shards"]:
            for key in ("raw_data", "zip_data"):
                if shard.get(key):
                    shard[key]["basename"] = f"{d.relative_to(out).as_posix()}/{shard[key]['basename']}"
            shards.append(shard)
    tmp = out / "index.json.tmp"
    tmp.write_text(json.dumps({"version": 2, "shards": shards}))
    tmp.replace(out / "index.json")
    return sum(s["samples"] for s in shards)


@dataclass
class Encoding:
    """What every bucket of one `dwb data precompute` run shares."""

    encoder: object  # a run's model (``train.recipes.frozen_model``) or ``OneTower``
    refs: dict  # {"vae": ref, "text_encoder": ref, ...}: where each part came from
    fingerprints: dict  # {part: {dtype: fingerprint}}
    dtype: str
    batch_size: int
    chunk_size: int
    world: int
    rank: int
    progress: bool


def precompute_latents(src: str, out: str, *, vae_ref: str | None = None, text_encoder_ref: str | None = None,
                       tokenizer_ref: str | None = None, encoder=None, refs: dict | None = None,
                       resolutions: list[int] | None = None, batch_size: int = 32, dtype: str = "float16",
                       device: str = "auto", chunk_size: int = 2048, cache: str | None = None,
                       progress: bool = True) -> list[dict]:
    """Encode every bucket of ``src`` into ``out/<side>``; returns one summary dict per bucket. ``encoder``: a run's
    model in float32 (``train.recipes.frozen_model``), ``refs`` naming where its parts came from; else the VAE and
    CLIP tower at ``vae_ref`` and ``text_encoder_ref`` (``OneTower``)."""
    from composer.utils import dist

    if dtype not in STORAGE_DTYPES:
        raise WorkbenchError(f"--dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    if batch_size < 1 or chunk_size < 1:
        raise WorkbenchError("--batch-size and --chunk-size must be positive")
    jobs = _sources(src, resolutions, cache)
    device = _join_ranks(device)
    if encoder is None:
        encoder = OneTower(*load_encoders(vae_ref, text_encoder_ref, tokenizer_ref))
        refs = {"vae": vae_ref, "text_encoder": text_encoder_ref}
    parts = encoder.frozen_components()
    for part in parts.values():
        part.to(device)
    enc = Encoding(encoder, {name: (refs or {}).get(name) for name in parts},
                   {name: part_fingerprints(part) for name, part in parts.items()}, dtype, batch_size, chunk_size,
                   dist.get_world_size(), dist.get_global_rank(), progress)
    return [encode_bucket(enc, side, local, remote, Path(out) / str(side)) for side, local, remote in jobs]


def _join_ranks(device: str) -> str:
    """The device this rank encodes on; under `composer -n N`, the process group joined (gloo or NCCL)."""
    from composer.utils import dist

    from models.generation import pick_device

    device = pick_device(device).type if device == "auto" else device
    if dist.get_world_size() > 1 and not dist.is_initialized():
        from composer.devices import DeviceCPU, DeviceGPU

        dist.initialize_dist(DeviceGPU() if device == "cuda" else DeviceCPU())
        if device == "cuda":
            device = f"cuda:{dist.get_local_rank()}"
    return device


def _open_source(local: str, remote: str | None):
    """The source bucket as a Streaming dataset (a local one's index checked against its shards, columns
    checked, read errors one line naming it), and its sample count."""
    from .loader import NamedStreamingDataset
    from models.datasets import check_safe_columns, count_samples, open_streaming

    where = f"the source dataset {remote or local}"
    n = count_samples(local) if remote is None else None
    try:
        dataset = open_streaming(lambda: NamedStreamingDataset(where=where, local=local or None, remote=remote,
                                                               shuffle=False, batch_size=1))
    except Exception as e:  # noqa: BLE001 - an unreachable or unreadable remote index: one line naming it
        raise WorkbenchError(f"cannot open {where}: {first_line(e)}") from None
    check_safe_columns(dataset, where)
    _refuse_loss_columns(dataset, where)
    n = len(dataset) if n is None else n
    if n == 0:
        raise WorkbenchError(f"{where} is empty")
    return dataset, n


def _refuse_loss_columns(dataset, where: str) -> None:
    """A DreamBooth dataset's class-image flags and masks weigh the loss per pixel; its latents would lose them, and
    its few images are encoded in seconds on the fly: refused in one line rather than silently trained unweighted."""
    from models.datasets import DREAMBOOTH_COLUMNS

    for shard in getattr(dataset, "shards", [])[:1]:
        held = sorted(set(DREAMBOOTH_COLUMNS) & set(getattr(shard, "column_names", [])))
        if held:
            raise WorkbenchError(f"{where} is a DreamBooth dataset (its {' and '.join(held)} weigh the loss), which "
                                 f"trains from its images: set data.precomputed=false and point data.path at it")


def _bucket_meta(enc: Encoding, dataset, side: int, n: int, source: str) -> dict:
    """``precompute.json`` of one bucket (unfinished), with shapes read off one encoded sample."""
    from .loader import center_square, to_model_range

    probe = to_model_range(center_square(dataset[0], side)[0])[None]
    mean, _, text = encode_batch(enc.encoder, probe, [""])
    empty = {key: encode_array(t[0].to(torch.float32).cpu().numpy().astype(enc.dtype))
             for key, t in (("empty_text", text.states), ("empty_pooled", text.pooled)) if t is not None}
    vae = enc.encoder.vae
    tokenizer = enc.encoder.tokenizer
    parts = {name: {"ref": enc.refs[name], "fingerprint": prints["float32"], "fingerprints": prints}
             for name, prints in enc.fingerprints.items()}
    parts["vae"]["config"] = json.loads(json.dumps(dict(vae.config), default=str))
    return {
        "format": LATENTS_FORMAT, "complete": False, "source": source, "resolution": side, "center_crop": True,
        "dtype": enc.dtype, "samples": n, "chunk_size": enc.chunk_size,
        "scaling_factor": float(vae.config.scaling_factor), "latent_shape": list(mean.shape[1:]),
        "text_shape": list(text.states.shape[1:]),
        "pooled_shape": None if text.pooled is None else list(text.pooled.shape[1:]),
        "family": enc.encoder.family, "frozen_parts": sorted(parts), **parts,
        "tokenizer": {"model_max_length": tokenizer.model_max_length, "vocab_size": len(tokenizer)},
        **empty,
        "text_alt": True,  # a column of the states of each caption's other phrasing (itself where it has none)
        "size_conditioning": True,  # original_size and crop_top_left columns
    }


def _claim(target: Path, meta: dict) -> None:
    """Rank 0: the target is empty or holds an unfinished run of the same job (then it resumes)."""
    meta_path = target / META
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        same = {k: old.get(k) for k in ("source", "resolution", "dtype", "samples", "chunk_size", "scaling_factor",
                                        "text_alt", "family", "frozen_parts", "text_shape", "pooled_shape")}
        if same != {k: meta[k] for k in same} or any(old.get(p, {}).get("fingerprint") != meta[p]["fingerprint"]
                                                      for p in meta["frozen_parts"]):
            raise WorkbenchError(f"{target} holds latents of another source, encoder or setting; choose an empty folder")
    elif target.exists() and any(target.iterdir()):
        raise WorkbenchError(f"{target} is not empty and holds no precomputed latents; choose an empty folder")
    if not (meta_path.is_file() and json.loads(meta_path.read_text()).get("complete")):
        target.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(meta))


def encode_bucket(enc: Encoding, side: int, local: str, remote: str | None, target: Path) -> dict:
    """One bucket, chunk by chunk (each rank its share), then merged by rank 0; a summary dict."""
    from models.common import barrier

    t0 = time.perf_counter()
    dataset, n = _open_source(local, remote)
    meta = _bucket_meta(enc, dataset, side, n, remote or str(Path(local).resolve()))
    if enc.rank == 0:
        _claim(target, meta)
    barrier()
    summary = {"resolution": side, "out": str(target), "samples": n, "encoded": 0, "resumed_chunks": 0}
    if json.loads((target / META).read_text()).get("complete"):
        return {**summary, "seconds": time.perf_counter() - t0, "already_done": True}
    chunk_dirs = [target / "chunks" / f"{k:05d}" for k in range((n + enc.chunk_size - 1) // enc.chunk_size)]
    mine = [k for k in range(len(chunk_dirs)) if k % enc.world == enc.rank]
    todo = [k for k in mine if not (chunk_dirs[k] / "index.json").is_file()]
    cols = latent_columns(meta["latent_shape"], meta["text_shape"], enc.dtype, meta["pooled_shape"])
    bar = tqdm(total=sum(min(enc.chunk_size, n - k * enc.chunk_size) for k in todo), unit="img",
               desc=f"precompute {side}px", disable=not enc.progress or enc.rank != 0)
    for k in todo:
        start, stop = k * enc.chunk_size, min(n, (k + 1) * enc.chunk_size)
        summary["encoded"] += encode_chunk(enc, dataset, side, range(start, stop), chunk_dirs[k], cols, bar)
    bar.close()
    barrier(patient=True)  # a rank may hold a chunk (2048 samples by default) more: minutes of VAE at 1024 px
    if enc.rank == 0:
        total = _merge_chunks(target, chunk_dirs)
        if total != n:
            raise WorkbenchError(f"{target}: merged {total} samples, expected {n}")
        (target / META).write_text(json.dumps({**meta, "complete": True}))
    barrier()
    return {**summary, "resumed_chunks": len(mine) - len(todo), "seconds": time.perf_counter() - t0,
            "already_done": False}


def encode_chunk(enc: Encoding, dataset, side: int, indices: range, folder: Path, cols: dict, bar) -> int:
    """Samples ``indices`` of the source into the MDS folder ``folder``, which appears only when whole."""
    from streaming import MDSWriter

    from .loader import center_square, other_phrasing, to_model_range

    shutil.rmtree(folder, ignore_errors=True)  # an unfinished chunk from an interrupted run
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    with MDSWriter(out=str(part), columns=cols, size_limit="256mb", compression=None) as writer:
        for b in range(indices.start, indices.stop, enc.batch_size):
            samples = [dataset[i] for i in range(b, min(indices.stop, b + enc.batch_size))]
            squares = [center_square(s, side) for s in samples]
            pixels = to_model_range(np.stack([pixels for pixels, _, _ in squares]))
            captions = [s["caption"] for s in samples]
            alts = {i: alt for i, alt in enumerate(map(other_phrasing, samples)) if alt != captions[i]}
            mean, std, text = encode_batch(enc.encoder, pixels, captions + list(alts.values()))
            mean, std = (x.float().cpu().numpy().astype(enc.dtype) for x in (mean, std))
            columns = {"text": _with_alts(text.states, len(samples), alts, enc.dtype)}
            if text.pooled is not None:
                columns["pooled"] = _with_alts(text.pooled, len(samples), alts, enc.dtype)
            for i, (s, (_, size, crop)) in enumerate(zip(samples, squares)):
                writer.write({"latent_mean": mean[i], "latent_std": std[i], "caption": s["caption"],
                              "original_size": np.array(size, dtype=np.int64),
                              "crop_top_left": np.array(crop, dtype=np.int64),
                              **{key + suffix: arrays[k][i] for key, arrays in columns.items()
                                 for k, suffix in enumerate(("", "_alt"))}})
            bar.update(len(samples))
    part.rename(folder)  # finished chunks appear whole
    return len(indices)


def _with_alts(encoded: torch.Tensor, m: int, alts: dict, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(the ``m`` captions' rows, their other phrasings' rows) of one batch's encoding of the captions followed by the
    other phrasings of those that have one (``alts``: sample -> phrasing); a caption without another phrasing is its
    own (not encoded twice)."""
    rows = encoded.float().cpu().numpy().astype(dtype)
    alt = rows[:m].copy()
    alt[list(alts)] = rows[m:]
    return rows[:m], alt
