"""The shapes domain's scorer: a small CNN that reads a scene's attributes back from an image.

Trained on the shapes training split (`dwb evaluate train-scorer`, or the demo's "scorer" stage), it
serves two purposes:

- **Domain FID.** Its 256-dimensional penultimate features follow the ``FeatureExtractor`` interface,
  so FID and KID can be computed on features that know what the domain's images should look like,
  without Inception weights.
- **GenEval-style attribute accuracy.** It reads a generated image's scene (``ShapesScorer.predict``);
  evaluate checks it against the scene the caption asks for (``evaluate/attribute_accuracy.py``).

Output layout: the scene's *layout* (one group, two groups one above the other, two groups side by
side, or nothing drawn: taught with blank backgrounds, so an empty sample is never right) and two
*slots*: slot 0 is the only group, or the upper / left one; slot 1 the lower / right one. Each slot
has colour, shape, count and size heads.

Every image, whatever its resolution, is resized to 32 px (``SCORER_SIZE``) with bicubic
interpolation inside the scorer. Training sees each image both at 32 px and after a trip through
16 px (box-downsampled, bicubic-upsampled), as phase-1 samples arrive, plus mild noise.

A wide or tall image is letterboxed first (`letterbox`): centred in a square of its longer side, filled with
its own background, so its shapes keep their form and its groups their places (left and right, top and
bottom), only smaller. A square-trained scorer so reads a wide scene's layout as it reads a square one's;
trained on data with wide and tall scenes it learns their smaller shapes too. A size is not learnt from
them: a large shape in a letterboxed wide frame is as large as a small one in a square.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.errors import WorkbenchError, first_line

from .grammar import COUNTS, Group, Scene, scene_from_meta
from .scenes import ALL_SHAPES, BACKGROUND, COLORS, PALETTE, PLACEMENTS, SHAPES, SIZES

SCORER_SIZE = 32
LAYOUTS = ("one group", *PLACEMENTS, "empty")  # "empty": nothing drawn (taught with blank images)
COLOR_NAMES = tuple(COLORS)
# A colour head of n classes reads the first n: the drawn colours, then the new ones a scorer was taught
# (`teach_new_concepts`), so a scorer trained on the shapes data alone reads as it always did; a shape head likewise.
PALETTE_NAMES = tuple(PALETTE)
GROWN = {"color": PALETTE_NAMES, "shape": ALL_SHAPES}  # the heads a scorer can be taught new classes of, and their names
SIZE_NAMES = tuple(SIZES)
COUNT_VALUES = tuple(COUNTS)  # 1, 2, 3
HEADS = {"color": len(COLOR_NAMES), "shape": len(SHAPES), "count": len(COUNT_VALUES), "size": len(SIZE_NAMES)}
FORMAT = "dwb-shapes-scorer-1"


class ShapesNet(nn.Module):
    """(B, 3, 32, 32) floats in [0, 1] -> (features (B, 256), logits per head)."""

    def __init__(self, width: int = 32, feature_dim: int = 256, colors: int = len(COLOR_NAMES),
                 shapes: int = len(SHAPES)):
        super().__init__()
        w = width
        self.body = nn.Sequential(
            nn.Conv2d(3, w, 5, stride=2, padding=2), nn.BatchNorm2d(w), nn.ReLU(inplace=True),          # 16 x 16
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),                                                                              # 8 x 8
            nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.BatchNorm2d(4 * w), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),                                                                              # 4 x 4
            nn.Flatten(),
            nn.Linear(4 * w * 16, feature_dim), nn.ReLU(inplace=True),
        )
        self.layout = nn.Linear(feature_dim, len(LAYOUTS))
        heads = {**HEADS, "color": colors, "shape": shapes}
        self.slots = nn.ModuleList(nn.ModuleDict({k: nn.Linear(feature_dim, n) for k, n in heads.items()}) for _ in range(2))
        self.feature_dim = feature_dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        f = self.body(x)
        out = {"layout": self.layout(f)}
        for i, heads in enumerate(self.slots):
            for k, head in heads.items():
                out[f"{k}{i}"] = head(f)
        return f, out


def letterbox(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) float -> (B, 3, S, S), S = max(H, W): each image centred on the median colour of its own edge
    pixels (the domain's background in the data; a generated image's background is near it, not exactly it)."""
    h, w = x.shape[-2:]
    if h == w:
        return x
    edge = torch.cat([x[..., 0, :], x[..., -1, :], x[..., :, 0], x[..., :, -1]], dim=-1)
    side = max(h, w)
    out = edge.median(dim=-1).values[..., None, None].expand(*x.shape[:-2], side, side).clone()
    top, left = (side - h) // 2, (side - w) // 2
    out[..., top:top + h, left:left + w] = x
    return out


def to_input(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) uint8 -> (B, 3, 32, 32) float in [0, 1]: letterboxed where H != W, bicubic to 32 px where the
    side differs."""
    x = letterbox(images.float().div(255.0))
    if x.shape[-1] != SCORER_SIZE or x.shape[-2] != SCORER_SIZE:
        x = F.interpolate(x, size=(SCORER_SIZE, SCORER_SIZE), mode="bicubic", align_corners=False).clamp(0.0, 1.0)
    return x


# ---------------------------------------------------------------------------------------------------- labels

def targets(scenes: list[Scene]) -> dict[str, torch.Tensor]:
    """Class indices per head; -100 (ignored) for slot 1 of a one-group scene."""
    out: dict[str, list[int]] = {"layout": []}
    for k in HEADS:
        out[f"{k}0"], out[f"{k}1"] = [], []
    for s in scenes:
        out["layout"].append(LAYOUTS.index(s.layout))
        for i in range(2):
            g = s.groups[i] if i < len(s.groups) else None
            out[f"color{i}"].append(PALETTE_NAMES.index(g.color) if g else -100)
            out[f"shape{i}"].append(ALL_SHAPES.index(g.shape) if g else -100)
            out[f"count{i}"].append(COUNT_VALUES.index(g.count) if g else -100)
            out[f"size{i}"].append(SIZE_NAMES.index(g.size) if g and g.size else -100)
    return {k: torch.tensor(v) for k, v in out.items()}


def read_scenes(logits: dict[str, torch.Tensor]) -> list[Scene]:
    """Predicted scenes from a batch of logits."""
    idx = {k: v.argmax(1).tolist() for k, v in logits.items()}
    scenes = []
    for b, lay in enumerate(idx["layout"]):
        n = {"one group": 1, "empty": 0}.get(LAYOUTS[lay], 2)
        groups = tuple(Group(PALETTE_NAMES[idx[f"color{i}"][b]], ALL_SHAPES[idx[f"shape{i}"][b]],
                             COUNT_VALUES[idx[f"count{i}"][b]], SIZE_NAMES[idx[f"size{i}"][b]]) for i in range(n))
        scenes.append(Scene(LAYOUTS[lay], groups))
    return scenes


# ---------------------------------------------------------------------------------------------------- scorer

class ShapesScorer:
    """The trained scorer: a ``FeatureExtractor`` for domain FID plus attribute predictions.

    Loaded from the file `train_scorer` writes (a plain state dict and its config, read with
    ``weights_only=True``).
    """

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        path = Path(path)
        if not path.is_file():
            raise WorkbenchError(f"shapes scorer not found at {path}: train one with "
                                 f"`dwb evaluate train-scorer SHAPES_DATA {path}` (the demo writes demo-output/scorer.pt)")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise WorkbenchError(f"cannot read shapes scorer {path}: {first_line(e)}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise WorkbenchError(f"{path} is not a shapes scorer (expected format {FORMAT})")
        cfg = json.loads(state["config"])
        classes = {"colors": cfg.get("colors", len(COLOR_NAMES)), "shapes": cfg.get("shapes", len(SHAPES))}  # more
        for key, names, word in (("colors", PALETTE_NAMES, "colours"), ("shapes", ALL_SHAPES, "shapes")):  # if taught
            if type(classes[key]) is not int or not 0 < classes[key] <= len(names):
                raise WorkbenchError(f"{path} reads {classes[key]!r} {word}; the shapes domain knows {len(names)}")
        self.net = ShapesNet(width=cfg["width"], feature_dim=cfg["feature_dim"], **classes)
        try:
            self.net.load_state_dict(state["weights"])
        except RuntimeError:
            raise WorkbenchError(f"{path} holds a scorer of another layout: train it again with "
                                 f"`dwb evaluate train-scorer`") from None
        self.device = torch.device(device)
        self.net.to(self.device).eval()
        self.info = cfg
        self.dim = self.net.feature_dim
        self.name = f"shapes-scorer-{self.dim}"
        with open(path, "rb") as f:
            self.weights_hash = hashlib.file_digest(f, "sha256").hexdigest()[:16]  # the extractor's identity

    @torch.no_grad()
    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        f, logits = self.net(to_input(images).to(self.device))
        return f.to(torch.float64).cpu(), {k: v.cpu() for k, v in logits.items()}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.run(images)[0]

    def predict(self, images: torch.Tensor) -> list[Scene]:
        return read_scenes(self.run(images)[1])


# ---------------------------------------------------------------------------------------------------- training

def load_split(folder: str | Path, limit: int | None = None, progress: bool = False) -> tuple[torch.Tensor, list[Scene]]:
    """All images of a shapes MDS bucket as (N, 3, S, S) uint8, and their scenes; a wide or tall image (an
    aspect-ratio bucket's) letterboxed to 32 px, its scene without sizes (see the module's docstring)."""
    images, scenes, _ = read_split(folder, limit, progress)
    return images, scenes


def read_split(folder: str | Path, limit: int | None = None,
               progress: bool = False) -> tuple[torch.Tensor, list[Scene], torch.Tensor]:
    """`load_split`'s images and scenes, and which images were square ((N,) bool)."""
    from ..datasets import open_local
    from tqdm import tqdm

    folder = Path(folder)
    if not (folder / "index.json").is_file():
        raise WorkbenchError(f"no shapes dataset at {folder} (index.json missing; `dwb data shapes` writes one)")
    ds = open_local(folder)
    n = min(len(ds), limit) if limit else len(ds)
    images, scenes, square = [], [], []
    for i in tqdm(range(n), desc=f"reading {folder.name}", unit="img", disable=not progress):
        sample = ds.get_item(i)
        meta = sample.get("meta")
        scene = scene_from_meta(meta) if isinstance(meta, dict) else None
        if scene is None:
            raise WorkbenchError(f"{folder} has no shapes attributes in its 'meta' column (sample {i})")
        image = np.asarray(sample["image"].convert("RGB"), dtype=np.uint8)
        square.append(image.shape[0] == image.shape[1])
        if not square[-1]:
            x = to_input(torch.from_numpy(image.copy()).permute(2, 0, 1)[None])  # PIL's array is read-only
            image = x[0].mul(255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
            scene = dataclasses.replace(scene, groups=tuple(dataclasses.replace(g, size=None) for g in scene.groups))
        images.append(image)
        scenes.append(scene)
    if not images:
        raise WorkbenchError(f"{folder} holds no samples")
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(), scenes, torch.tensor(square)


EMPTY_RATE = 0.04


def _with_blanks(x: torch.Tensor, target: dict[str, torch.Tensor], gen: torch.Generator):
    """Replace ~4% of the batch by blank backgrounds labelled "empty": a sample with nothing drawn must not
    pass as a right answer (the shapes data itself never has an empty scene)."""
    blank = torch.rand(x.shape[0], generator=gen) < EMPTY_RATE
    if not blank.any():
        return x, target
    x, target = x.clone(), {k: v.clone() for k, v in target.items()}
    bg = torch.tensor(BACKGROUND, dtype=x.dtype).view(1, 3, 1, 1) / 255.0
    shift = (torch.rand(int(blank.sum()), 1, 1, 1, generator=gen) - 0.5) * 0.1  # slightly lighter or darker
    x[blank] = (bg + shift).clamp(0, 1).expand(-1, -1, *x.shape[-2:])
    for k in target:
        target[k][blank] = LAYOUTS.index("empty") if k == "layout" else -100
    return x, target


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A third of the batch goes through 16 px and back; every image gets noise of a random strength."""
    x = x.clone()
    b = x.shape[0]
    low = torch.rand(b, generator=gen) < 1 / 3
    if low.any():
        small = F.avg_pool2d(x[low], 2)  # a box filter, as the dataset renders its smaller bucket
        x[low] = F.interpolate(small, size=x.shape[-2:], mode="bicubic", align_corners=False).clamp(0, 1)
    sigma = torch.rand(b, 1, 1, 1, generator=gen) * 0.04
    return (x + sigma * torch.randn(x.shape, generator=gen)).clamp(0, 1)


def _loss(logits: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(F.cross_entropy(logits[k], target[k], ignore_index=-100) for k in logits
               if (target[k] != -100).any())


@torch.no_grad()
def reading_accuracy(net: ShapesNet, images: torch.Tensor, scenes: list[Scene], batch_size: int = 256,
                       low_res: bool = False) -> dict[str, float]:
    """Per-attribute accuracy on real images: layout, colour, shape, count and size over every group present.

    ``low_res``: the images first go through 16 px (box) and back, as phase-1 samples do.
    """
    net.eval()
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    for s in range(0, len(images), batch_size):
        x = to_input(images[s:s + batch_size])
        if low_res:
            x = F.interpolate(F.avg_pool2d(x, 2), size=x.shape[-2:], mode="bicubic", align_corners=False).clamp(0, 1)
        _, logits = net(x)
        t = targets(scenes[s:s + batch_size])
        for k, v in logits.items():
            attr = "layout" if k == "layout" else k[:-1]
            mask = t[k] != -100
            right[attr] = right.get(attr, 0) + int((v.argmax(1)[mask] == t[k][mask]).sum())
            total[attr] = total.get(attr, 0) + int(mask.sum())
    acc = {k: right[k] / total[k] for k in right if total[k]}
    acc["mean"] = sum(acc.values()) / len(acc)
    return acc


def fit(net: ShapesNet, images: torch.Tensor, scenes: list[Scene], *, epochs: int, batch_size: int, lr: float,
        gen: torch.Generator, progress: bool) -> None:
    """AdamW under a one-cycle lr schedule, each batch with blanks, 16 px trips and noise (``_augment``)."""
    from tqdm import tqdm

    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * (len(images) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.15)
    t_all = targets(scenes)
    net.to(memory_format=torch.channels_last).train()  # one CPU thread: 0.306 s a step of 128, not 0.351
    with tqdm(total=steps, desc="shapes scorer", unit="step", disable=not progress) as bar:
        for _ in range(epochs):
            order = torch.randperm(len(images), generator=gen)
            for s in range(0, len(order) - batch_size + 1, batch_size):
                idx = order[s:s + batch_size]
                x, target = _with_blanks(to_input(images[idx]), {k: v[idx] for k, v in t_all.items()}, gen)
                _, logits = net(_augment(x, gen).contiguous(memory_format=torch.channels_last))
                loss = _loss(logits, target)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    net.to(memory_format=torch.contiguous_format)


def train_scorer(data: str | Path, out: str | Path, *, epochs: int = 6, batch_size: int = 128, lr: float = 3e-3,
                 width: int = 32, seed: int = 0, limit: int | None = None, progress: bool = True) -> dict:
    """Train on ``data/32`` (the training split), check on ``data/eval/32`` (held out), write ``out``.

    Returns the held-out accuracies; they are stored in the file too.
    """
    data = Path(data)
    train_dir = data / str(SCORER_SIZE) if (data / str(SCORER_SIZE)).is_dir() else data
    eval_dir = data / "eval" / str(SCORER_SIZE)
    images, scenes = load_split(train_dir, limit, progress=progress)
    if images.shape[-1] != SCORER_SIZE:
        raise WorkbenchError(f"the scorer trains on {SCORER_SIZE} px images; {train_dir} holds {images.shape[-1]} px")
    held_images, held_scenes, held_square = read_split(eval_dir) if eval_dir.is_dir() else (None, None, None)
    torch.manual_seed(seed)
    net = ShapesNet(width=width)
    t0 = time.perf_counter()
    fit(net, images, scenes, epochs=epochs, batch_size=batch_size, lr=lr, gen=torch.Generator().manual_seed(seed),
        progress=progress)
    info = {"width": width, "feature_dim": net.feature_dim, "epochs": epochs, "batch_size": batch_size, "lr": lr,
            "seed": seed, "train": str(train_dir), "n_train": len(images), "seconds": round(time.perf_counter() - t0, 1)}
    if held_images is not None:
        info["held_out"] = {k: round(v, 4) for k, v in reading_accuracy(net, held_images, held_scenes).items()}
        info["held_out_16px"] = {k: round(v, 4) for k, v in
                                 reading_accuracy(net, held_images, held_scenes, low_res=True).items()}
        info["n_held_out"] = len(held_images)
        if not held_square.all():  # wide and tall scenes, letterboxed: read on their own
            framed = (~held_square).nonzero().flatten().tolist()
            info["held_out_non_square"] = {k: round(v, 4) for k, v in reading_accuracy(
                net, held_images[framed], [held_scenes[i] for i in framed]).items()}
            info["n_held_out_non_square"] = len(framed)
    write_scorer(net, info, out)
    return info


def write_scorer(net: ShapesNet, info: dict, out: str | Path) -> None:
    """The scorer file `ShapesScorer` reads: the weights and ``info`` (its config), written whole."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    torch.save({"format": FORMAT, "config": json.dumps(info), "weights": net.state_dict()}, tmp)
    tmp.replace(out)


def grow_heads(net: ShapesNet) -> None:
    """Each slot's colour and shape heads grown to every colour and shape the domain knows (``GROWN``): the old rows
    kept, the new ones initialised as a fresh layer's."""
    for heads in net.slots:
        for attribute, names in GROWN.items():
            grown = nn.Linear(net.feature_dim, len(names))
            with torch.no_grad():
                n = heads[attribute].out_features
                grown.weight[:n], grown.bias[:n] = heads[attribute].weight, heads[attribute].bias
            heads[attribute] = grown


def teach_new_concepts(scorer: str | Path, data: str | Path, out: str | Path, new: tuple[torch.Tensor, list[Scene]],
                       held_new: tuple[torch.Tensor, list[Scene]], *, base_images: int = 2048, epochs: int = 3,
                       batch_size: int = 128, lr: float = 1e-3, seed: int = 0, progress: bool = False) -> dict:
    """The scorer ``scorer`` taught the new colours and shapes (``NEW_COLORS``, ``NEW_SHAPES``) from ``new`` (32 px
    images holding them, and their scenes), written to ``out``: its colour and shape heads grown (`grow_heads`), then
    fitted as `train_scorer` fits, at a lower lr, on ``new`` mixed with the first ``base_images`` of ``data``'s
    training split, so it keeps reading the drawn ones. Returns its held-out accuracies on ``data``'s held-out split
    and on ``held_new``, also stored in the file."""
    old = ShapesScorer(scorer)
    net, cfg = old.net, dict(old.info)
    torch.manual_seed(seed)
    grow_heads(net)
    data = Path(data)
    images, scenes = load_split(data / str(SCORER_SIZE), base_images)
    images, scenes = torch.cat([images, new[0]]), scenes + list(new[1])
    t0 = time.perf_counter()
    fit(net, images, scenes, epochs=epochs, batch_size=batch_size, lr=lr, gen=torch.Generator().manual_seed(seed),
        progress=progress)
    info = {**{k: cfg[k] for k in ("width", "feature_dim")}, "colors": len(PALETTE_NAMES), "shapes": len(ALL_SHAPES),
            "taught_from": str(scorer), "epochs": epochs, "lr": lr, "seed": seed, "n_base": len(images) - len(new[0]), "n_new": len(new[0]),
            "seconds": round(time.perf_counter() - t0, 1),
            "held_out_new": {k: round(v, 4) for k, v in reading_accuracy(net, *held_new).items()}}
    if (data / "eval" / str(SCORER_SIZE)).is_dir():
        info["held_out"] = {k: round(v, 4) for k, v in
                            reading_accuracy(net, *load_split(data / "eval" / str(SCORER_SIZE))).items()}
    write_scorer(net, info, out)
    return info
