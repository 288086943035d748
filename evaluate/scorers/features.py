"""Feature extractors for distribution metrics, and the one resize policy every image goes through.

A feature extractor is any object with ``name`` (str), ``weights_hash`` (str), ``dim`` (int) and
``__call__(images) -> (B, D) features`` for ``images`` a (B, 3, H, W) uint8 tensor: square (S x S), or at an
aspect (evaluate's ``aspect``), which each extractor takes as its authors' preprocessing does (Inception and
DINOv2 resize the whole image to their square input, as clean-fid does; CLIP's processor centre-crops; see
docs/evaluate.md). Inception-v3 (torch-fidelity's port of the 2015 TensorFlow graph, run through torchmetrics)
is the default; a domain extractor (the shapes scorer, say) can replace it by following the same interface.

Resize policy (``RESIZE_POLICY``): every image, reference or generated, is converted to RGB,
centre-cropped to a square and resized with PIL bicubic to ``S`` pixels (the generation resolution);
Inception then resizes the uint8 batch to 299 x 299 with TensorFlow-1-compatible bilinear
interpolation, as the original FID code did.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np
import torch
from PIL import Image

from models.errors import WorkbenchError, first_line

INCEPTION_WEIGHTS = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_WEIGHTS}"
RESIZE_POLICY = "rgb-centercrop-bicubic-{size}+tf1-bilinear-299"


class FeatureExtractor(Protocol):
    name: str
    weights_hash: str
    dim: int

    def __call__(self, images: torch.Tensor) -> torch.Tensor: ...


def resize_policy(size: int) -> str:
    return RESIZE_POLICY.format(size=size)


def prepare_image(image: Image.Image, size: int) -> np.ndarray:
    """(size, size, 3) uint8: RGB, centre crop to a square, PIL bicubic resize (a no-op at the right size)."""
    image = image.convert("RGB")
    w, h = image.size
    side = min(w, h)
    if w != h:
        left, top = (w - side) // 2, (h - side) // 2
        image = image.crop((left, top, left + side, top + side))
    if side != size:
        image = image.resize((size, size), Image.Resampling.BICUBIC)
    return np.asarray(image, dtype=np.uint8)


def to_batch(images: list[np.ndarray]) -> torch.Tensor:
    """(B, 3, S, S) uint8 from a list of (S, S, 3) uint8 arrays."""
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()


def file_hash(path: str | Path, n: int = 16) -> str:
    from models.common import sha256_of

    return sha256_of(path)[:n]


@contextlib.contextmanager
def exact_matmul() -> Iterator[None]:
    """TF32 off for the metric pass: features must not depend on the GPU generation."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class InceptionExtractor:
    """Inception-v3 pool features (2048 by default) from a local weights file; never downloads."""

    def __init__(self, weights_path: str | Path, dim: int = 2048, device: str | torch.device = "cpu"):
        from torchmetrics.image.fid import NoTrainInceptionV3

        path = Path(weights_path)
        if path.is_dir():
            path = path / INCEPTION_WEIGHTS
        if not path.is_file():
            raise WorkbenchError(f"Inception weights not found at {path}: download {INCEPTION_WEIGHTS} "
                                 f"({INCEPTION_URL}) and pass its path with --inception-weights")
        try:  # a plain state dict loads safely; only then does torch-fidelity read it
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise WorkbenchError(f"cannot read Inception weights {path}: {first_line(e)}") from None
        if not isinstance(state, dict) or "Mixed_7c.branch_pool.conv.weight" not in state:
            raise WorkbenchError(f"{path} does not hold Inception-v3 weights (expected {INCEPTION_WEIGHTS})")
        del state
        self.model = NoTrainInceptionV3(name="inception-v3-compat", features_list=[str(dim)],
                                        feature_extractor_weights_path=str(path)).to(device)
        self.device = torch.device(device)
        self.dim = dim
        self.name = f"inception-v3-pool{dim}"
        self.weights_hash = file_hash(path)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        with exact_matmul():
            return self.model(images.to(self.device)).to(torch.float64).cpu()  # (B, D)


def write_random_inception(folder: str | Path, seed: int = 0) -> Path:
    """torch-fidelity's Inception-v3 with seeded random weights, saved as ``folder/INCEPTION_WEIGHTS``: for tests
    and timing (the architecture's cost), never for reported scores.

    Convolutions get He initialisation (fan-in, ReLU gain). With PyTorch's default initialisation the
    activations shrink layer by layer: pool-3 features came out near 3e-8 with a spread of 4e-10 across
    images, so every FID was about 1e-13. With He's they are O(0.1-1) and differ between images.
    """
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class Fresh(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, *args, **kwargs):  # keep the fresh weights
            return None

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    empty = folder / "empty.pth"
    torch.save({}, empty)  # a weights path, so the constructor does not download the trained weights
    torch.manual_seed(seed)
    model = Fresh("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(empty))
    empty.unlink()
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    torch.save(model.state_dict(), folder / INCEPTION_WEIGHTS)
    return folder / INCEPTION_WEIGHTS
