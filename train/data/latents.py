"""The precomputed-latents format (`dwb data precompute` writes it, training reads it): one MDS dataset per
resolution bucket with ``latent_mean``, ``latent_std`` (the VAE posterior, ``scaling_factor`` applied once),
``text``, ``text_alt`` (the per-token states of the caption and of its other phrasing), ``pooled``,
``pooled_alt`` (their pooled output, where the family conditions on one), ``original_size``, ``crop_top_left``
(SDXL's size and crop conditioning) and ``caption``, and ``precompute.json``: the scaling factor, the family whose
conditioning the states are, fingerprints of the VAE's and each text tower's weights in each dtype training holds
them in, the crop, the shapes and the empty caption's states and pooled output. Training refuses latents of other
weights, families or settings.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from models.checkpoints import fingerprint
from models.errors import WorkbenchError, first_line

LATENTS_FORMAT = "diffusion-workbench/latents/1"
META = "precompute.json"
STORAGE_DTYPES = ("float16", "float32")


def encode_array(a: np.ndarray) -> dict:
    return {"dtype": str(a.dtype), "shape": list(a.shape), "base64": base64.b64encode(a.tobytes()).decode()}


def decode_array(d: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["base64"]), dtype=d["dtype"]).reshape(d["shape"]).copy()


def latent_columns(latent_shape, text_shape, dtype: str, pooled_shape=None) -> dict[str, str]:
    lat = ",".join(map(str, latent_shape))
    txt = ",".join(map(str, text_shape))
    columns = {"latent_mean": f"ndarray:{dtype}:{lat}", "latent_std": f"ndarray:{dtype}:{lat}",
               "text": f"ndarray:{dtype}:{txt}", "text_alt": f"ndarray:{dtype}:{txt}", "caption": "str",
               "original_size": "ndarray:int64:2", "crop_top_left": "ndarray:int64:2"}
    if pooled_shape is not None:
        pooled = ",".join(map(str, pooled_shape))
        columns |= {"pooled": f"ndarray:{dtype}:{pooled}", "pooled_alt": f"ndarray:{dtype}:{pooled}"}
    return columns


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
            first = first_line(e)
            raise WorkbenchError(f"cannot read {url}: {first}") from None
    if local is None or not local.is_file():
        raise WorkbenchError(f"{path or remote} holds no precomputed latents ({META} missing; "
                             f"make them with `dwb data precompute`)")
    meta = json.loads(local.read_text())
    if meta.get("format") != LATENTS_FORMAT:
        raise WorkbenchError(f"{local} is not a diffusion-workbench latent dataset")
    if not meta.get("complete"):
        raise WorkbenchError(f"the precomputed latents at {local.parent} are unfinished: run the same "
                             f"`dwb data precompute` command again to finish them")
    return meta


def held_fingerprint(meta: dict, name: str, part) -> str:
    """The fingerprint ``meta`` records for its frozen part ``name`` in the dtype ``part`` is held in (latents from
    before the dtypes were recorded: the float32 one)."""
    floating = next((t.dtype for t in part.parameters() if t.is_floating_point()), None)
    prints = meta[name].get("fingerprints") or {}
    return prints.get(str(floating).removeprefix("torch."), meta[name]["fingerprint"])


def check_compatible(meta: dict, *, vae, resolution: int, where: str, towers: dict | None = None,
                     family: str | None = None) -> None:
    """Refuse latents made with another VAE, scaling factor, text tower, conditioning or resolution. ``towers``:
    the model's text towers by component name, ``family`` the conditioning it reads (``LatentDiffusion.family``);
    None: a model that encodes the stored captions itself, whose stored states are not read."""
    sf = float(vae.config.scaling_factor)
    if abs(float(meta["scaling_factor"]) - sf) > 1e-9:
        raise WorkbenchError(f"{where}: latents were precomputed with VAE scaling factor {meta['scaling_factor']} but "
                             f"this model's VAE uses {sf}; precompute them again with this VAE")
    vae_fp, made = fingerprint(vae), held_fingerprint(meta, "vae", vae)
    if made != vae_fp:
        raise WorkbenchError(f"{where}: latents were precomputed with another VAE (weights {made}, "
                             f"this model's are {vae_fp}); precompute them again with this VAE")
    stored = meta.get("family", "sd2")  # latents from before families were recorded: SD 1/2's one tower
    if family is not None and stored != family:
        raise WorkbenchError(f"{where}: the stored text states are {stored}'s conditioning and this model reads "
                             f"{family}'s; precompute them with `dwb data precompute --config` of this run")
    for name, tower in (towers or {}).items():
        if name not in meta:
            raise WorkbenchError(f"{where}: the latents were precomputed without this model's {name}; precompute "
                                 f"them with `dwb data precompute --config` of this run")
        got, made = fingerprint(tower), held_fingerprint(meta, name, tower)
        if made != got:
            raise WorkbenchError(f"{where}: text states were precomputed with another {name.replace('_', ' ')} "
                                 f"(weights {made}, this model's are {got})")
    if int(meta["resolution"]) != resolution:
        raise WorkbenchError(f"{where}: latents are of {meta['resolution']} px images but data.resolution is {resolution}")
