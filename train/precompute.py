"""`dwb data precompute SRC OUT`: encode an image-caption MDS dataset once with the frozen VAE and text encoder.

Training then skips both encoders at every step. For each resolution bucket the output is a new MDS
dataset (``OUT/<side>``) with the columns

- ``latent_mean``, ``latent_std``: the VAE posterior of the centre-cropped image, both already
  multiplied by the VAE's ``scaling_factor`` (applied here, exactly once). Training samples
  ``mean + std * eps`` at every step, so it sees the same distribution as on-the-fly encoding;
- ``text``: the text encoder's hidden states of the caption (what the UNet cross-attends to);
- ``caption``: the caption itself;

and ``precompute.json`` with the scaling factor, fingerprints of the VAE and text-encoder weights
(training refuses latents made with other weights), the crop, the shapes, and the empty caption's
hidden states: caption dropout substitutes them at train time, so which captions are dropped stays
random at every step instead of being frozen into the dataset.

Work is split into chunks of consecutive samples; under ``composer -n N`` each rank encodes every
N-th chunk. A chunk is finished when its ``index.json`` exists, so an interrupted run restarted
with the same command redoes only unfinished chunks. The merged ``index.json`` lists the chunks in
order, so the output's sample order is the source's whatever the number of ranks.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from .errors import WorkbenchError

FORMAT = "diffusion-workbench/latents/1"
META = "precompute.json"
DTYPES = ("float16", "float32")


def fingerprint(module: torch.nn.Module) -> str:
    """A hash of a module's weights (names, dtypes, shapes and bytes), independent of the file format."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-d tensors too
    return h.hexdigest()[:16]


def encode_array(a: np.ndarray) -> dict:
    return {"dtype": str(a.dtype), "shape": list(a.shape), "base64": base64.b64encode(a.tobytes()).decode()}


def decode_array(d: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["base64"]), dtype=d["dtype"]).reshape(d["shape"]).copy()


def columns(latent_shape, text_shape, dtype: str) -> dict[str, str]:
    lat = ",".join(map(str, latent_shape))
    txt = ",".join(map(str, text_shape))
    return {"latent_mean": f"ndarray:{dtype}:{lat}", "latent_std": f"ndarray:{dtype}:{lat}",
            "text": f"ndarray:{dtype}:{txt}", "text_alt": f"ndarray:{dtype}:{txt}", "caption": "str"}


# ---------------------------------------------------------------------------------------------
# Reading the metadata (local folder or remote, through Streaming's downloaders)


def read_meta(path: str | Path, remote: str | None = None) -> dict:
    """``precompute.json`` of a latent dataset; fetched from ``remote`` into ``path`` when given."""
    local = Path(path) / META if path else None
    if remote:
        from streaming.base.storage.download import CloudDownloader

        if local is None:
            import tempfile

            local = Path(tempfile.mkdtemp(prefix="dwb-latents-")) / META
        url = remote.rstrip("/") + "/" + META
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            CloudDownloader.direct_download(url, str(local), 60)
        except Exception as e:  # noqa: BLE001 - any storage error becomes one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise WorkbenchError(f"cannot read {url}: {first}") from None
    if local is None or not local.is_file():
        raise WorkbenchError(f"{path or remote} holds no precomputed latents ({META} missing; "
                             f"make them with `dwb data precompute`)")
    meta = json.loads(local.read_text())
    if meta.get("format") != FORMAT:
        raise WorkbenchError(f"{local} is not a diffusion-workbench latent dataset")
    if not meta.get("complete"):
        raise WorkbenchError(f"the precomputed latents at {local.parent} are unfinished: run the same "
                             f"`dwb data precompute` command again to finish them")
    return meta


def check_compatible(meta: dict, *, vae, text_encoder, resolution: int, where: str) -> None:
    """Refuse latents made with another VAE, scaling factor, text encoder or resolution."""
    sf = float(vae.config.scaling_factor)
    if abs(float(meta["scaling_factor"]) - sf) > 1e-9:
        raise WorkbenchError(f"{where}: latents were precomputed with VAE scaling factor {meta['scaling_factor']} but "
                             f"this model's VAE uses {sf}; precompute them again with this VAE")
    vae_fp = fingerprint(vae)
    if meta["vae"]["fingerprint"] != vae_fp:
        raise WorkbenchError(f"{where}: latents were precomputed with another VAE (weights {meta['vae']['fingerprint']}, "
                             f"this model's are {vae_fp}); precompute them again with this VAE")
    te_fp = fingerprint(text_encoder)
    if meta["text_encoder"]["fingerprint"] != te_fp:
        raise WorkbenchError(f"{where}: text states were precomputed with another text encoder (weights "
                             f"{meta['text_encoder']['fingerprint']}, this model's are {te_fp})")
    if int(meta["resolution"]) != resolution:
        raise WorkbenchError(f"{where}: latents are of {meta['resolution']} px images but data.resolution is {resolution}")


# ---------------------------------------------------------------------------------------------
# Loading the encoders


def _from(cls, ref: str, subfolder: str, what: str):
    """``ref`` is the part's own folder (with config.json), a diffusers-layout root, or a hub id."""
    from .components import _load_part

    p = Path(ref)
    if p.is_dir() and ((p / "config.json").is_file() or (p / "tokenizer_config.json").is_file() or (p / "vocab.json").is_file()):
        try:
            return cls.from_pretrained(str(p))
        except Exception as e:  # noqa: BLE001
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise WorkbenchError(f"cannot load {what} from {p}: {first}") from None
    return _load_part(cls, ref, subfolder, what)


def load_encoders(vae_ref: str, text_encoder_ref: str, tokenizer_ref: str | None):
    from diffusers import AutoencoderKL
    from transformers import CLIPTextModel, CLIPTokenizer

    vae = _from(AutoencoderKL, vae_ref, "vae", "VAE")
    text_encoder = _from(CLIPTextModel, text_encoder_ref, "text_encoder", "text encoder")
    if tokenizer_ref is None:  # next to the text encoder: ROOT/tokenizer, or a sibling of ROOT/text_encoder
        p = Path(text_encoder_ref)
        tokenizer_ref = str(p.parent) if (p / "config.json").is_file() else text_encoder_ref
    tokenizer = _from(CLIPTokenizer, tokenizer_ref, "tokenizer", "tokenizer")
    return vae.eval().requires_grad_(False), text_encoder.eval().requires_grad_(False), tokenizer


# ---------------------------------------------------------------------------------------------
# Encoding


@torch.no_grad()
def encode_batch(vae, text_encoder, tokenizer, pixels: torch.Tensor, captions: list[str]):
    """(B, 3, R, R) in [-1, 1] and captions -> scaled posterior mean and std, text hidden states."""
    device = next(vae.parameters()).device
    posterior = vae.encode(pixels.to(device)).latent_dist
    sf = float(vae.config.scaling_factor)
    ids = tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                    return_tensors="pt").input_ids
    text = text_encoder(ids.to(device))[0]
    return posterior.mean * sf, posterior.std * sf, text


def _sources(src: str, resolutions: list[int] | None, cache: str | None) -> list[tuple[int, str, str | None]]:
    """(side, local folder, remote) per bucket to encode."""
    from .mds import bucket_dirs

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
        return [(resolutions[0], str(root), None)]
    buckets = bucket_dirs(root)
    if not buckets:
        raise WorkbenchError(f"{src} holds neither an MDS dataset (index.json) nor resolution buckets (256/, 512/ ...)")
    wanted = resolutions or sorted(buckets)
    missing = [r for r in wanted if r not in buckets]
    if missing:
        raise WorkbenchError(f"{src} has no bucket {', '.join(map(str, missing))} (it has {', '.join(map(str, sorted(buckets)))})")
    return [(r, str(buckets[r]), None) for r in wanted]


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


def precompute(src: str, out: str, *, vae_ref: str, text_encoder_ref: str, tokenizer_ref: str | None = None,
               resolutions: list[int] | None = None, batch_size: int = 32, dtype: str = "float16",
               device: str = "auto", chunk_size: int = 2048, cache: str | None = None,
               progress: bool = True) -> list[dict]:
    """Encode every bucket of ``src`` into ``out/<side>``; returns one summary dict per bucket."""
    from composer.utils import dist
    from streaming import MDSWriter, StreamingDataset
    from tqdm import tqdm

    from .data import crop_to_array, other_phrasing, to_model_range
    from .mds import check_safe_columns, count_samples

    if dtype not in DTYPES:
        raise WorkbenchError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if batch_size < 1 or chunk_size < 1:
        raise WorkbenchError("--batch-size and --chunk-size must be positive")
    jobs = _sources(src, resolutions, cache)
    if device == "auto":
        from .device import pick_device

        device = pick_device("auto").type
    world, rank = dist.get_world_size(), dist.get_global_rank()
    if world > 1 and not dist.is_initialized():
        from composer.devices import DeviceCPU, DeviceGPU

        dist.initialize_dist(DeviceGPU() if device == "cuda" else DeviceCPU())
        if device == "cuda":
            device = f"cuda:{dist.get_local_rank()}"

    vae, text_encoder, tokenizer = load_encoders(vae_ref, text_encoder_ref, tokenizer_ref)
    vae.to(device)
    text_encoder.to(device)
    fingerprints = {"vae": fingerprint(vae), "text_encoder": fingerprint(text_encoder)}
    summaries = []
    for side, local, remote in jobs:
        target = Path(out) / str(side)
        t0 = time.perf_counter()
        try:
            n = count_samples(local) if remote is None else None
        except WorkbenchError:
            n = None
        dataset = StreamingDataset(local=local or None, remote=remote, shuffle=False, batch_size=1)
        check_safe_columns(dataset, f"the source dataset {remote or local}")
        n = len(dataset) if n is None else n
        if n == 0:
            raise WorkbenchError(f"the source dataset {remote or local} is empty")

        # Shapes from one sample, and the metadata every rank agrees on.
        probe = to_model_range(crop_to_array(dataset[0]["image"], side))[None]
        mean, _, text = encode_batch(vae, text_encoder, tokenizer, probe, [""])
        latent_shape, text_shape = list(mean.shape[1:]), list(text.shape[1:])
        empty = text[0].to(torch.float32).cpu().numpy().astype(dtype)
        meta = {
            "format": FORMAT, "complete": False, "source": remote or str(Path(local).resolve()), "resolution": side,
            "center_crop": True, "dtype": dtype, "samples": n, "chunk_size": chunk_size,
            "scaling_factor": float(vae.config.scaling_factor), "latent_shape": latent_shape, "text_shape": text_shape,
            "vae": {"ref": vae_ref, "fingerprint": fingerprints["vae"], "config": json.loads(json.dumps(dict(vae.config), default=str))},
            "text_encoder": {"ref": text_encoder_ref, "fingerprint": fingerprints["text_encoder"]},
            "tokenizer": {"model_max_length": tokenizer.model_max_length, "vocab_size": len(tokenizer)},
            "empty_text": encode_array(empty),
            "text_alt": True,  # a column of the states of each caption's other phrasing (itself where it has none)
        }
        meta_path = target / META
        if rank == 0:
            if meta_path.is_file():
                old = json.loads(meta_path.read_text())
                same = {k: old.get(k) for k in ("source", "resolution", "dtype", "samples", "chunk_size", "scaling_factor",
                                                "text_alt")}
                if same != {k: meta[k] for k in same} or old.get("vae", {}).get("fingerprint") != fingerprints["vae"] \
                        or old.get("text_encoder", {}).get("fingerprint") != fingerprints["text_encoder"]:
                    raise WorkbenchError(f"{target} holds latents of another source, encoder or setting; choose an empty folder")
            elif target.exists() and any(target.iterdir()):
                raise WorkbenchError(f"{target} is not empty and holds no precomputed latents; choose an empty folder")
            if not (meta_path.is_file() and json.loads(meta_path.read_text()).get("complete")):
                target.mkdir(parents=True, exist_ok=True)
                meta_path.write_text(json.dumps(meta))
        dist.barrier()
        if json.loads(meta_path.read_text()).get("complete"):
            summaries.append({"resolution": side, "out": str(target), "samples": n, "encoded": 0, "resumed_chunks": 0,
                              "seconds": time.perf_counter() - t0, "already_done": True})
            continue

        n_chunks = (n + chunk_size - 1) // chunk_size
        chunk_dirs = [target / "chunks" / f"{k:05d}" for k in range(n_chunks)]
        mine = [k for k in range(n_chunks) if k % world == rank]
        cols = columns(latent_shape, text_shape, dtype)
        done = [k for k in mine if (chunk_dirs[k] / "index.json").is_file()]
        todo = [k for k in mine if k not in done]
        encoded = 0
        bar = tqdm(total=sum(min(chunk_size, n - k * chunk_size) for k in todo), unit="img",
                   desc=f"precompute {side}px", disable=not progress or rank != 0)
        for k in todo:
            shutil.rmtree(chunk_dirs[k], ignore_errors=True)  # an unfinished chunk from an interrupted run
            part = chunk_dirs[k].with_name(chunk_dirs[k].name + ".part")
            shutil.rmtree(part, ignore_errors=True)
            start, stop = k * chunk_size, min(n, (k + 1) * chunk_size)
            with MDSWriter(out=str(part), columns=cols, size_limit="256mb", compression=None) as writer:
                for b in range(start, stop, batch_size):
                    samples = [dataset[i] for i in range(b, min(stop, b + batch_size))]
                    pixels = to_model_range(np.stack([crop_to_array(s["image"], side) for s in samples]))
                    captions = [s["caption"] for s in samples]
                    alts = {i: alt for i, alt in enumerate(map(other_phrasing, samples)) if alt != captions[i]}
                    mean, std, text = encode_batch(vae, text_encoder, tokenizer, pixels, captions + list(alts.values()))
                    mean, std, text = (x.float().cpu().numpy().astype(dtype) for x in (mean, std, text))
                    m = len(samples)
                    text_alt = text[:m].copy()  # a caption without another phrasing is its own (not encoded twice)
                    text_alt[list(alts)] = text[m:]
                    for i, s in enumerate(samples):
                        writer.write({"latent_mean": mean[i], "latent_std": std[i], "text": text[i],
                                      "text_alt": text_alt[i], "caption": s["caption"]})
                    bar.update(len(samples))
                    encoded += len(samples)
            part.rename(chunk_dirs[k])  # finished chunks appear whole
        bar.close()
        dist.barrier()
        if rank == 0:
            total = _merge_chunks(target, chunk_dirs)
            if total != n:
                raise WorkbenchError(f"{target}: merged {total} samples, expected {n}")
            meta["complete"] = True
            meta_path.write_text(json.dumps(meta))
        dist.barrier()
        summaries.append({"resolution": side, "out": str(target), "samples": n, "encoded": encoded,
                          "resumed_chunks": len(done), "seconds": time.perf_counter() - t0, "already_done": False})
    return summaries
