"""`dwb evaluate adapter`: whether an adapter helped, and at which strength: each adapter file x strength against
its base on the same prompts and seeds, DreamBench's three questions with a paired interval each.

- **subject fidelity** (held-out prompts, which carry the trigger): each image's mean cosine to the training
  images, on DINOv2's CLS features (``dino_i``) and CLIP's image embeddings (``clip_i``);
- **prompt adherence** (held-out prompts): the CLIP score (``clip_score``, 100 x cos(image, prompt)) and, where
  the domain has a scorer (the shapes domain's, ``--scorer``), each image's every-attribute-right verdict
  (``attr_all_all``; a prompt outside the domain's grammar has none and does not count);
- **drift** (neutral prompts, without the trigger): each image's DINOv2 cosine distance from the base's own image
  at the same seed (``drift_dino``: the base's own is 0), and each configured preference score's change
  (``neutral_<score>``).

Each figure is B - A, B the adapted entry (``models.checkpoints.Entry``: ``BASE + FILE@S``) and A the base, with
the interval ``statistics.bootstrap.mean_interval`` gives a paired per-image mean (the t-interval on per-prompt
contributions) and Holm's adjustment within each family (``verdict.with_verdicts``), so every
word here reads as `dwb evaluate compare` reads it: "cannot tell" where the interval covers 0.

The recommendation: among the entries better than the base on subject fidelity (every fidelity metric that has a
verdict favours the entry after Holm's adjustment, none favours the base) and worse on no prompt-adherence metric
(text alignment and attribute accuracy),
the one that drifts least (the smallest ``drift_dino``; the larger fidelity gain on a tie); none where no entry is.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.checkpoints import Entry, EntryAdapter, entry_adapter, find_entry, open_entry, weights_of
from models.common import write_text_whole
from models.errors import WorkbenchError
from models.generation import DEFAULT_GUIDANCE, DEFAULT_STEPS, MAX_STRENGTH, pick_device

from .compare import metric_difference
from .layout import safe_path_part
from .attribute_accuracy import judge
from .names import ATTRIBUTE_ACCURACY, SUBJECT_FIDELITY, TEXT_ALIGNMENT, metric
from .prompts import Prompt, load_prompts
from .reference import count_images, iter_images
from .samples import Provenance, generate_samples, write_manifest
from .statistics.bootstrap import prompt_weights, weighted_means
from .verdict import family_replicates, overall, with_verdicts

STRENGTHS = (0.5, 0.75, 1.0)
TRAINING_SIDE = 224  # training images are read at DINOv2's input side; each scorer resizes as it does for samples
MAX_TRAINING_IMAGES = 1000  # a DreamBooth set is 3 to 30 images, a style LoRA's some hundreds
REPORT_FILE = "adapter-report.json"


@dataclass
class AdapterSetup:
    """What `dwb evaluate adapter` is asked: the training images, held-out and neutral prompts, the scorers and
    how the images are drawn (the same settings and seeds for the base and every entry)."""

    images: str
    prompts: str
    neutral: str
    out: str
    dinov2: str
    clip: str
    strengths: tuple[float, ...] = STRENGTHS
    preference: dict[str, str] = field(default_factory=dict)  # column -> weights (evaluate/scorers/preference.py)
    scorer: str | None = None  # the shapes domain's scorer file: attribute accuracy on the held-out prompts
    n_prompts: int | None = None
    n_per_prompt: int = 1
    guidance: float = DEFAULT_GUIDANCE
    steps: int = DEFAULT_STEPS
    sampler: str | None = None
    size: int | None = None
    seed: int = 0
    batch_size: int = 8
    bootstrap: int = 200
    device: str = "auto"
    progress: bool = False


class Scorers:
    """The models every side is scored with: DINOv2, CLIP (its image embeddings and its score), preference."""

    def __init__(self, setup: AdapterSetup, device: torch.device):
        from .scorers.clip import ClipScorer
        from .scorers.dinov2 import Dinov2Extractor
        from .scorers.preference import load_preference_scorers

        self.dino = Dinov2Extractor(setup.dinov2, device=device)
        self.clip = ClipScorer(setup.clip, device=device)
        self.clip_images = self.clip.image_extractor()
        self.preference = load_preference_scorers(setup.preference, device, clip=setup.clip)
        self.domain = None
        if setup.scorer:
            from models.shapes import ShapesScorer

            self.domain = ShapesScorer(setup.scorer, device=device)

    def every_attribute_right(self, images: torch.Tensor, captions: list[str]) -> np.ndarray:
        """1 where the domain scorer reads every attribute the caption asks for, 0 where not, NaN for a caption
        outside the domain's grammar (``attribute_accuracy.judge``, as `dwb evaluate run` judges)."""
        from models.shapes import parse_caption, read_scenes

        _, logits = self.domain.run(images)
        asked = [parse_caption(c) for c in captions]
        return np.array([np.nan if a is None else float(judge(a, seen)["all"])
                         for a, seen in zip(asked, read_scenes(logits))])

    def training_features(self, folder: str | Path) -> dict[str, torch.Tensor]:
        """The training images' unit DINOv2 features and CLIP image embeddings; an unreadable image, an empty or
        oversized folder is one line."""
        folder = Path(folder)
        if not folder.is_dir():
            raise WorkbenchError(f"training images not found: {folder} (give the adapter's image folder)")
        n = count_images(folder)
        if not 0 < n <= MAX_TRAINING_IMAGES:
            raise WorkbenchError(f"{folder} holds {n} images; the report compares with 1 to {MAX_TRAINING_IMAGES}")
        images = list(iter_images(folder, TRAINING_SIDE))
        if any(im is None for im in images):
            raise WorkbenchError(f"{folder}: {sum(im is None for im in images)} of {n} images cannot be read")
        batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
        return {"dino": _unit(self.dino(batch)), "clip": self.clip_images(batch)}


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.to(torch.float64), dim=1)


class SideScores:
    """One entry's images of one prompt set, scored while they are in memory (``generate_samples``' ``on_batch``):
    per image (in (prompt index, image index) order, ``values``) its features and scores."""

    def __init__(self, scorers: Scorers):
        self.scorers, self.parts = scorers, []

    def on_batch(self, images: torch.Tensor, jobs: list[tuple[Prompt, int]]) -> None:
        from .scorers.preference import scores_of

        captions = [p.text for p, _ in jobs]
        s = self.scorers
        self.parts.append({"keys": [(p.index, i) for p, i in jobs], "dino": _unit(s.dino(images)),
                           "clip": s.clip_images(images), "clip_score": s.clip.update(images, captions).numpy(),
                           "preference": {k: scores_of(m, images, captions) for k, m in s.preference.items()},
                           **({"attr_all_all": s.every_attribute_right(images, captions)} if s.domain else {})})

    def values(self) -> dict:
        keys = [k for part in self.parts for k in part["keys"]]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        joined = {name: (torch.cat if name in ("dino", "clip") else np.concatenate)([part[name] for part in self.parts])
                  for name in ("dino", "clip", "clip_score", "attr_all_all") if name in self.parts[0]}
        preference = {k: np.concatenate([part["preference"][k] for part in self.parts])[order]
                      for k in self.parts[0]["preference"]}
        return {"prompts": np.array([keys[i][0] for i in order]), "keys": [keys[i] for i in order],
                **{name: v[order] for name, v in joined.items()}, "preference": preference}


def fidelity(features: torch.Tensor, training: torch.Tensor) -> np.ndarray:
    """Each image's mean cosine to the training images (unit features on both sides): DreamBench's DINO and
    CLIP-I, per image."""
    return (features @ training.T).mean(dim=1).numpy()


def side_values(held: dict, neutral: dict, base_neutral: dict, training: dict) -> dict[str, tuple]:
    """metric -> (prompt ids, per-image values) of one side; the base is its own ``base_neutral``."""
    values = {"dino_i": (held["prompts"], fidelity(held["dino"], training["dino"])),
              "clip_i": (held["prompts"], fidelity(held["clip"], training["clip"])),
              "clip_score": (held["prompts"], held["clip_score"])}
    if "attr_all_all" in held:
        values["attr_all_all"] = (held["prompts"], held["attr_all_all"])
    if neutral["keys"] != base_neutral["keys"]:
        raise WorkbenchError("the base and the entry drew different neutral prompts or seeds")
    # 1 - cos of unit vectors, as half their squared distance: exactly 0 for the base's own image (1 - u.u is a
    # rounding error of 1e-17 there, which a paired interval of zero width would read as a difference)
    drift = 0.5 * ((neutral["dino"] - base_neutral["dino"]) ** 2).sum(dim=1).numpy()
    values["drift_dino"] = (neutral["prompts"], np.clip(drift, 0.0, 2.0))
    for key, scores in neutral["preference"].items():
        values[f"neutral_{key}"] = (neutral["prompts"], scores)
    return values


def paired_figures(base: dict[str, tuple], adapted: dict[str, tuple], replicates: int, seed: int) -> dict:
    """Each metric's B - A (B: the adapted entry, A: the base) with its interval, p and verdicts after Holm's
    adjustment within its family, and the families' overall verdicts."""
    sizes = Counter(metric(name).family for name in adapted)
    counts = {family: family_replicates(replicates, n) for family, n in sizes.items()}
    figures = []
    for name, (ids, b) in adapted.items():
        a = base[name][1]
        n = counts[metric(name).family]
        weights = prompt_weights(ids, n, seed)  # one draw for both sides: paired
        reps = weighted_means(b, weights) - weighted_means(a, weights)
        figures.append(metric_difference(name, _mean(a), _mean(b), reps, images=(ids, b, a)))
    figures = with_verdicts(figures)
    return {"metrics": figures, "overall": overall(figures), "replicates": counts}


def _mean(values: np.ndarray) -> float:
    """The mean of the images with a value (NaN: an image the metric does not judge); NaN where none has one."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if len(kept) else float("nan")


def _zero_drift(values: dict) -> dict[str, tuple]:
    """The base against itself on neutral prompts: no distance from its own images."""
    ids, _ = values["drift_dino"]
    return {**values, "drift_dino": (ids, np.zeros(len(ids)))}


def draw_side(entry: Entry, setup: AdapterSetup, scorers: Scorers, prompt_sets: dict[str, list[Prompt]],
              device: torch.device) -> dict[str, dict]:
    """The entry's images of each prompt set (``OUT/samples/<label>/<set>``, the seeds of `dwb evaluate run`),
    scored: set name -> ``SideScores.values``."""
    weights = weights_of(entry.base)  # as `dwb sample` opens it: EMA where the checkpoint holds EMA weights
    pipe = open_entry(entry, ema=weights == "ema", device=device)
    source = Provenance(entry.ref, entry.label, entry.hash(), weights, **entry.a1111())
    drawn = {}
    for name, prompts in prompt_sets.items():
        folder = Path(setup.out) / "samples" / safe_path_part(entry.label) / name
        side = SideScores(scorers)
        records = generate_samples(pipe, prompts, folder, source=source, n_per_prompt=setup.n_per_prompt,
                                   guidance=setup.guidance, steps=setup.steps, size=setup.size,
                                   sampler=setup.sampler, batch_size=setup.batch_size, seed=setup.seed,
                                   progress=setup.progress, on_batch=side.on_batch)
        write_manifest(records, folder)
        drawn[name] = {**side.values(), "folder": str(folder.relative_to(setup.out))}
    del pipe
    return drawn


def adapter_entries(base: Entry, adapters: list[str | Path], strengths: tuple[float, ...]) -> list[Entry]:
    """Each adapter file at each strength on ``base``, every file read (its header, its hash) before any drawing."""
    if not adapters:
        raise WorkbenchError("give at least one adapter file to report on")
    if not strengths or any(not abs(s) <= MAX_STRENGTH for s in strengths):
        raise WorkbenchError(f"strengths {', '.join(f'{s:g}' for s in strengths) or 'none'}: give one or more, each "
                             f"from -{MAX_STRENGTH:g} to {MAX_STRENGTH:g}")
    files = [entry_adapter(Path(a), 1.0) for a in adapters]
    return [Entry(base.base, (EntryAdapter(f.path, float(s), f.name, f.hash),)) for f in files for s in strengths]


def recommend(results: list[dict]) -> dict:
    """The entry the report recommends and why, in one sentence (the module's note gives the rule)."""
    def gains(result, family):
        verdicts = [m["better_holm"] for m in result["metrics"] if m["family"] == family and not m["unmeasured"]]
        return verdicts and all(v == "B" for v in verdicts)

    def loses(result, family):
        return any(m["better_holm"] == "A" for m in result["metrics"] if m["family"] == family)

    def figure(result, name):
        return next(m for m in result["metrics"] if m["metric"] == name)

    better = [r for r in results if gains(r, SUBJECT_FIDELITY) and not loses(r, TEXT_ALIGNMENT)
              and not loses(r, ATTRIBUTE_ACCURACY)]
    if not better:
        return {"entry": None, "sentence": "no adapter and strength is recommended: none is better than the base on "
                                           "subject fidelity after Holm's adjustment without losing prompt "
                                           "adherence (cannot tell, or worse, on each)"}
    best = min(better, key=lambda r: (figure(r, "drift_dino")["difference"], -figure(r, "dino_i")["difference"]))
    dino, drift = figure(best, "dino_i"), figure(best, "drift_dino")
    others = f", the least drift of the {len(better)} that are" if len(better) > 1 else ""
    return {"entry": best["entry"], "file": best["file"], "strength": best["strength"],
            "sentence": f"{best['entry']}: better than the base on subject fidelity ({dino['sentence']}) and worse on "
                        f"no prompt-adherence metric{others} (DINO distance from the base's image on neutral prompts "
                        f"{drift['difference']:.3g})"}


def adapter_report(base: str | Path, adapters: list[str | Path], setup: AdapterSetup) -> dict:
    """Score the base and each adapter x strength on the same prompts and seeds; write ``OUT/adapter-report.json``
    and ``OUT/adapter-report.html``; return the report."""
    t0 = time.perf_counter()
    device = pick_device(setup.device)
    found = find_entry(base)
    if found.adapters:
        raise WorkbenchError(f"{base}: the base is a checkpoint alone; give the adapter files after it")
    entries = adapter_entries(found, adapters, setup.strengths)
    prompt_sets = {"held-out": load_prompts(setup.prompts, setup.n_prompts),
                   "neutral": load_prompts(setup.neutral, setup.n_prompts)}
    scorers = Scorers(setup, device)
    training = scorers.training_features(setup.images)
    base_drawn = draw_side(found, setup, scorers, prompt_sets, device)
    base_values = _zero_drift(side_values(base_drawn["held-out"], base_drawn["neutral"], base_drawn["neutral"],
                                          training))
    results = []
    for entry in entries:
        drawn = draw_side(entry, setup, scorers, prompt_sets, device)
        values = side_values(drawn["held-out"], drawn["neutral"], base_drawn["neutral"], training)
        adapter = entry.adapters[0]
        results.append({"entry": entry.label, "checkpoint": entry.ref, "checkpoint_hash": entry.hash(),
                        "file": str(adapter.path), "strength": adapter.strength, "samples": drawn["held-out"]["folder"],
                        "neutral_samples": drawn["neutral"]["folder"],
                        **paired_figures(base_values, values, setup.bootstrap, setup.seed), **entry.columns()})
    report = {"base": found.label, "base_checkpoint": found.ref, "base_hash": found.hash(),
              "base_samples": base_drawn["held-out"]["folder"], "images": str(setup.images),
              "n_training_images": int(training["dino"].shape[0]), "prompts": setup.prompts,
              "neutral": setup.neutral, "n_prompts": {k: len(v) for k, v in prompt_sets.items()},
              "n_per_prompt": setup.n_per_prompt, "guidance": setup.guidance, "steps": setup.steps,
              "sampler": setup.sampler, "seed": setup.seed, "bootstrap": setup.bootstrap,
              "dinov2": f"{scorers.dino.name}@{scorers.dino.weights_hash}", "clip": scorers.clip.name,
              "preference_models": {k: m.name for k, m in scorers.preference.items()}, "scorer": setup.scorer,
              "entries": results, "recommendation": recommend(results),
              "seconds": round(time.perf_counter() - t0, 3)}
    out = Path(setup.out)
    write_text_whole(out / REPORT_FILE, json.dumps(report, indent=1) + "\n")
    from .adapter_page import write_adapter_page

    write_adapter_page(out, report)
    return report
