"""The precomputed-latents format (`dwb data precompute` writes it, training reads it): one MDS dataset per
resolution bucket with ``latent_mean``, ``latent_std`` (the VAE posterior, ``scaling_factor`` applied once),
``text``, ``text_alt`` (hidden states of the caption and of its other phrasing) and ``caption``, and
``precompute.json``: the scaling factor, fingerprints of the VAE and text-encoder weights, the crop, the
shapes and the empty caption's hidden states. Training refuses latents of other weights or settings.
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


def latent_columns(latent_shape, text_shape, dtype: str) -> dict[str, str]:
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


def check_compatible(meta: dict, *, vae, text_encoder, resolution: int, where: str) -> None:
    """Refuse latents made with another VAE, scaling factor, text encoder or resolution (``text_encoder`` None: a
    model that encodes the stored captions itself, whose text states are not read)."""
    sf = float(vae.config.scaling_factor)
    if abs(float(meta["scaling_factor"]) - sf) > 1e-9:
        raise WorkbenchError(f"{where}: latents were precomputed with VAE scaling factor {meta['scaling_factor']} but "
                             f"this model's VAE uses {sf}; precompute them again with this VAE")
    vae_fp = fingerprint(vae)
    if meta["vae"]["fingerprint"] != vae_fp:
        raise WorkbenchError(f"{where}: latents were precomputed with another VAE (weights {meta['vae']['fingerprint']}, "
                             f"this model's are {vae_fp}); precompute them again with this VAE")
    te_fp = fingerprint(text_encoder) if text_encoder is not None else meta["text_encoder"]["fingerprint"]
    if meta["text_encoder"]["fingerprint"] != te_fp:
        raise WorkbenchError(f"{where}: text states were precomputed with another text encoder (weights "
                             f"{meta['text_encoder']['fingerprint']}, this model's are {te_fp})")
    if int(meta["resolution"]) != resolution:
        raise WorkbenchError(f"{where}: latents are of {meta['resolution']} px images but data.resolution is {resolution}")
