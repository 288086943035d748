"""Scoring checkpoints: samples per guidance scale, FID/KID against cached reference statistics, CLIP score.

Under ``composer -n N`` every rank generates and embeds its share of the images (``samples.plan_batches``);
feature statistics and CLIP sums are gathered on rank 0, which writes the manifest and the results.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.checkpoints import (Checkpoint, Entry, describe, find_checkpoint, find_entry, native_size_of, open_entry,
                                parse_entry, recommended_settings, weights_of)
from models.generation import (DEFAULT_STEPS, Settings, aspect_bucket, check_drawable, parse_aspect, pick_device,
                               pipeline_dtype, sampler_of, starting_settings)
from models.families import family_or_ours
from models.common import barrier, broadcast_object, gather_objects, global_rank, join_group, world_size
from models.errors import CheckpointError, WorkbenchError

from .config import GUIDANCE_SWEEP, EvalConfig, check_eval_config, weights_choice
from .scorers.features import FeatureExtractor, InceptionExtractor, resize_policy
from .layout import samples_folder
from .names import PREFERENCE_COLUMNS
from .prompts import Prompt, load_prompts
from .reference import check_reference_size, reference_stats
from .row import FEATURES, RowScorer, row_metrics, save_features
from .samples import Provenance, generate_samples, write_category_grids, write_manifest
from .store import ResultsStore, checkpoint_cost_columns, checkpoint_identity


def check_output_folder(out: str | Path) -> None:
    """An output folder that cannot be written stops scoring before any checkpoint is opened.

    Each call probes with a file of its own name: every rank of ``composer -n N`` probes the folder at once, and
    with one shared name a rank's unlink found the file gone (another rank had removed it) and stopped the run
    with "No such file or directory"."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise WorkbenchError(f"cannot write to the output folder {out} ({e.strerror})") from None


def init_distributed(device: torch.device) -> None:
    """Join the process group `composer -n N` set up (gloo on CPU, NCCL on GPU); nothing for one process."""
    join_group(device)


@dataclass
class Opened:
    """One checkpoint, ready to score: what `Evaluator.open` found and loaded."""
    found: Checkpoint
    source: Provenance
    pipe: object  # a diffusers StableDiffusionPipeline
    sampler: str
    size: int
    references: dict  # metric -> reference statistics at `size`
    steps: int = DEFAULT_STEPS
    sampler_given: str | None = None  # the sampler asked for (the flag or the checkpoint's recommended): names folders
    guidance: tuple[float, ...] = ()  # the scales scored
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # prompt index -> (width, height) of its aspect
    entry: Entry | None = None  # the checkpoint with the adapters applied to it (models.checkpoints.Entry)
    trained: Checkpoint | None = None  # what a run wrote that the entry stands for (an adapter checkpoint), else found


class Evaluator:
    """Holds what every checkpoint shares: extractor, CLIP, prompts and the reference statistics."""

    def __init__(self, cfg: EvalConfig, extractor: FeatureExtractor | None = None):
        self.cfg = check_eval_config(cfg)
        self.device = pick_device(cfg.device)
        self.dtype = pipeline_dtype(cfg.dtype, self.device)  # generation only: features stay float32/float64
        init_distributed(self.device)
        self.scorer = None
        if extractor is None and cfg.scorer and cfg.inception_weights:
            raise WorkbenchError("give either --inception-weights (FID on Inception features) or --scorer (the shapes "
                                 "domain's), not both: each row has one feature extractor")
        if extractor is None and cfg.scorer:
            from models.shapes import ShapesScorer

            extractor = self.scorer = ShapesScorer(cfg.scorer, device=self.device)
        elif extractor is None and not cfg.inception_weights:
            raise WorkbenchError("give --inception-weights (FID on Inception features) or --scorer (the shapes domain's)")
        self.extractor = extractor or InceptionExtractor(cfg.inception_weights, dim=cfg.inception_features, device=self.device)
        self.clip = self.clip_images = None
        if cfg.cmmd and not cfg.clip:
            raise WorkbenchError("--cmmd needs a CLIP model: give --clip FOLDER_OR_HUB_ID (CMMD compares its image "
                                 "embeddings)")
        if cfg.clip:
            from .scorers.clip import ClipScorer

            self.clip = ClipScorer(cfg.clip, device=self.device)
            if cfg.cmmd:
                self.clip_images = self.clip.image_extractor()
        self.dinov2 = None
        if cfg.dinov2:
            from .scorers.dinov2 import Dinov2Extractor

            self.dinov2 = Dinov2Extractor(cfg.dinov2, device=self.device)
        from .scorers.preference import load_preference_scorers

        self.preference = load_preference_scorers({k: getattr(cfg, k) for k in PREFERENCE_COLUMNS}, self.device,
                                                  clip=cfg.clip)
        self.prompts: list[Prompt] = load_prompts(cfg.prompts, cfg.n_prompts, reference=cfg.reference,
                                                  aspect_column=cfg.aspect_column)
        aspect = parse_aspect(cfg.aspect) if cfg.aspect is not None else None
        self.aspects = {p.index: p.aspect or aspect for p in self.prompts if (p.aspect or aspect) is not None}
        check_reference_size(cfg.reference, cfg.n_reference, cfg.allow_fewer_reference)
        check_output_folder(cfg.out)
        self.store = ResultsStore(cfg.out)
        self._reference: dict[tuple[int, str], object] = {}

    def reference(self, size: int, extractor: FeatureExtractor | None = None):
        """Rank 0's reference statistics (None on other ranks); an error there stops every rank."""
        extractor = extractor or self.extractor
        if (size, extractor.name) not in self._reference:
            ref, error = None, None
            if global_rank() == 0:
                try:
                    ref = reference_stats(self.cfg.reference, extractor, size, self.cfg.n_reference,
                                          self.cfg.cache or Path(self.cfg.out) / "cache",
                                          batch_size=self.cfg.batch_size, allow_fewer=self.cfg.allow_fewer_reference,
                                          kid_max=self.cfg.kid_subset_size * 10, progress=self.cfg.progress)
                except WorkbenchError as e:
                    error = str(e)
            # the other ranks wait here, and learn of rank 0's error: patiently, as rank 0 alone decodes and embeds
            # every reference image (25 minutes for 50,000 at 1024 px), past the group's timeout
            error = broadcast_object(error, patient=True)
            if error:
                raise WorkbenchError(error)
            self._reference[(size, extractor.name)] = ref
        return self._reference[(size, extractor.name)]

    def record_unreadable(self, checkpoint: Checkpoint | str | Path, error: Exception, ref: str | None = None) -> None:
        """A checkpoint that cannot be opened: one row saying why, so a watcher does not try it again
        (until the file changes, or ``--retry-unreadable``); ``ref``: the reference its row carries where that is
        an entry of it (``BASE + FILE@S``), not its own."""
        import logging

        logging.getLogger("evaluate").warning("warning: cannot score %s: %s", getattr(checkpoint, "ref", checkpoint), error)
        if global_rank() == 0:
            ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(str(checkpoint), "unreadable", "",
                                                                                    Path(checkpoint))
            self.store.append({"checkpoint": ref or ckpt.ref, "status": "unreadable", "error": str(error),
                               **checkpoint_identity(ckpt), "time": time.time()})

    def score(self, checkpoint: Checkpoint | Entry | str | Path, model: str | None = None,
              trained: Checkpoint | None = None) -> list[dict]:
        """Score one checkpoint (or entry) at every guidance scale; rank 0 appends the rows to the store and returns
        them. ``trained``: the checkpoint a run wrote that the entry stands for (an adapter checkpoint, whose adapter
        is the entry's file): the rows' step, cost and file identity are its.

        A problem of the checkpoint itself is a ``CheckpointError``; anything else is the setup's."""
        t0 = time.perf_counter()
        opened = self.open(checkpoint, model)
        opened.trained = trained
        rows = [row for guidance in opened.guidance if (row := self.score_guidance(opened, guidance)) is not None]
        if global_rank() == 0:
            for row in rows:
                row["seconds_checkpoint"] = round(time.perf_counter() - t0, 3)
            self.store.append_rows(rows)  # one write: a crash never leaves a checkpoint half-recorded
        barrier(patient=True)  # rank 0 alone computed the metrics (bootstrap, PRDC) and wrote the samples' files
        return rows

    def open(self, checkpoint: Checkpoint | Entry | str | Path, model: str | None) -> Opened:
        """The checkpoint's pipeline, provenance, sampler, image size and the reference statistics at that size.
        ``BASE + FILE@S`` is one entry (``models.checkpoints.Entry``): the base opened, the adapters applied, named
        and hashed as the entry."""
        cfg = self.cfg
        entry = find_entry(checkpoint)
        found = entry.base
        if cfg.parts and found.kind == "single-file":  # --parts: where the single files' other parts come from
            found = find_checkpoint(found.path, parts=cfg.parts)
            entry = Entry(found, entry.adapters)
        weights = weights_of(found, weights_choice(cfg))
        source = Provenance(entry.ref, model or entry.label, entry.hash(), weights, **entry.a1111())
        chosen, guidance, sampler_given = self.settings_of(found)
        info = describe(found)
        family = family_or_ours(info.family)
        known = chosen["size"] or info.resolution
        sizes = self.sizes_at(known, family) if known else None  # before the weights are read, where it can be
        pipe = open_entry(entry, ema=weights == "ema", device=self.device, dtype=self.dtype)
        size = chosen["size"] or native_size_of(found, pipe)
        sizes = self.sizes_at(size, family) if sizes is None else sizes
        references = {"fid": self.reference(size)}
        if self.clip_images is not None:
            references["cmmd"] = self.reference(size, self.clip_images)
        if self.dinov2 is not None:
            references["fd_dinov2"] = self.reference(size, self.dinov2)
        return Opened(found, source, pipe, sampler_of(Settings(sampler=chosen["sampler"])), size, references,
                      steps=chosen["steps"], sampler_given=sampler_given, guidance=guidance, sizes=sizes, entry=entry)

    def sizes_at(self, side: int, family) -> dict[int, tuple[int, int]]:
        """Each prompt with an aspect (``aspect``, or its own from ``aspect_column``) -> the aspect bucket of side x
        side pixels on the family's size step (``train.data.aspect_bucket``), which the family draws; a side given
        (``size``) or shared out to buckets that the family cannot draw is one line (the native side is the model's
        own: a tiny model's VAE may draw sides the full-size family does not)."""
        if self.aspects or self.cfg.size is not None:
            check_drawable(family, (side, side), "size", limits=None)
        buckets = {a: aspect_bucket(a, side, family.size_step()) for a in set(self.aspects.values())}
        return {index: buckets[a] for index, a in self.aspects.items()}

    def settings_of(self, found: Checkpoint) -> tuple[dict, tuple[float, ...], str | None]:
        """Steps, sampler and size (``models.generation.starting_settings``: the flags, then the checkpoint's
        recommended ones, then the defaults), the guidance scales (the sweep gains the checkpoint's recommended
        scale where the sweep was not chosen, so the images its users draw are among those scored) and the
        sampler asked for, by a flag or the checkpoint (None: the default, which names no folder)."""
        cfg = self.cfg
        recommended = recommended_settings(found)
        guidance = tuple(cfg.guidance)
        swept = guidance == GUIDANCE_SWEEP  # the scales were not chosen
        given = {"steps": cfg.steps, "sampler": cfg.sampler, "size": cfg.size, "guidance": None if swept else guidance}
        chosen, line = starting_settings(given, recommended)
        if swept and "guidance" in recommended and recommended["guidance"] not in guidance:
            guidance = tuple(sorted((*guidance, recommended["guidance"])))
        if line and global_rank() == 0:
            print(f"{found.label}: {line}")
        return chosen, guidance, cfg.sampler or recommended.get("sampler")

    def score_guidance(self, opened: Opened, guidance: float) -> dict | None:
        """Every rank generates and embeds its share of one guidance scale's images; rank 0 gets the row."""
        cfg = self.cfg
        rank, world = global_rank(), world_size()
        t_start = time.perf_counter()
        scorer = RowScorer(self.extractor, scorer=self.scorer, clip=self.clip, clip_images=self.clip_images,
                           dinov2=self.dinov2, preference=self.preference, kid_max=cfg.kid_subset_size * 10, seed=rank)
        samples = samples_folder(opened.source.model, guidance, opened.sampler_given,
                                 aspect_text(cfg.aspect, cfg.aspect_column))
        records = generate_samples(opened.pipe, self.prompts, Path(cfg.out) / samples, source=opened.source,
                                   n_per_prompt=cfg.n_per_prompt, guidance=guidance, steps=opened.steps,
                                   size=opened.size, sampler=opened.sampler_given, batch_size=cfg.batch_size,
                                   seed=cfg.seed, rank=rank, world=world, progress=cfg.progress and rank == 0,
                                   sizes=opened.sizes, on_batch=scorer.on_batch)
        mine = {"records": records, "features": scorer.part()}
        gathered = gather_objects(mine)
        if rank != 0:
            return None
        all_records = [r for part in gathered for r in part["records"]]
        t = time.perf_counter()
        metrics, images = row_metrics([part["features"] for part in gathered], opened.references, self.prompts,
                                      kid_subsets=cfg.kid_subsets, kid_subset_size=cfg.kid_subset_size,
                                      bootstrap=cfg.bootstrap, seed=cfg.seed)
        seconds_metrics = scorer.seconds + time.perf_counter() - t
        write_manifest(all_records, Path(cfg.out) / samples, extra=images.per_image())
        save_features(Path(cfg.out) / samples / FEATURES, images, opened.references)
        write_category_grids(all_records, Path(cfg.out) / samples, title=f"{opened.source.model} cfg {guidance:g}")
        seconds_total = time.perf_counter() - t_start
        row = self.row(opened, guidance, samples, len(images.keys))
        return {**row, **metrics, "seconds_generate": round(seconds_total - seconds_metrics, 3),
                "seconds_metrics": round(seconds_metrics, 3), "seconds_total": round(seconds_total, 3)}

    def row(self, opened: Opened, guidance: float, samples: Path, n_images: int) -> dict:
        """What a row says about how it was scored and what its checkpoint cost to reach (the metrics and timings
        are added to it)."""
        cfg, fid_reference = self.cfg, opened.references["fid"]
        trained = opened.trained or opened.found
        return {"model": opened.source.model, "checkpoint": opened.source.checkpoint,
                "checkpoint_hash": opened.source.checkpoint_hash, "weights": opened.source.weights,
                **(opened.entry.columns() if opened.entry is not None else {}),
                "step": trained.step or 0, **checkpoint_cost_columns(trained.path),
                "guidance": float(guidance), "n_images": n_images,
                "n_reference": fid_reference.stats.n, "reference_skipped": fid_reference.skipped,
                "prompts": cfg.prompts, "sampler": opened.sampler, "steps": opened.steps, "size": opened.size,
                "aspect": aspect_text(cfg.aspect, cfg.aspect_column),
                "dtype": str(self.dtype).removeprefix("torch."),
                "extractor": f"{self.extractor.name}@{self.extractor.weights_hash}",
                "resize": resize_policy(opened.size),
                "dinov2": f"{self.dinov2.name}@{self.dinov2.weights_hash}" if self.dinov2 is not None else None,
                **({"preference_models": {k: s.name for k, s in self.preference.items()}} if self.preference else {}),
                "samples": str(samples), "status": "ok", **checkpoint_identity(trained), "time": time.time()}


def aspect_text(aspect: str | None, column: str | None) -> str | None:
    """A row's ``aspect``: "16:9", "column NAME", "column NAME, else 16:9", or None (square)."""
    words = [f"column {column}"] if column is not None else []
    words += [aspect if not words else f"else {aspect}"] if aspect is not None else []
    return ", ".join(words) or None


def evaluate_checkpoints(cfg: EvalConfig, checkpoints: list[str | Path], extractor: FeatureExtractor | None = None) -> list[dict]:
    """`dwb evaluate run`: score each checkpoint, then refresh the CSV and the report."""
    from .report import write_report

    from models.checkpoints import is_hub_id

    for c in checkpoints:  # a typo is the setup's problem: nothing is scored
        base, adapters = parse_entry(c)
        if not ("://" in base or Path(base).exists() or is_hub_id(base)):
            raise WorkbenchError(f"checkpoint not found: {base}")
        if missing := [str(p) for p, _ in adapters if not p.is_file()]:
            raise WorkbenchError(f"adapter file not found: {missing[0]} (in {c})")
    ev = Evaluator(cfg, extractor)
    rows, unreadable = [], []
    for ckpt in checkpoints:
        try:
            rows += ev.score(ckpt)
        except CheckpointError as e:  # that checkpoint only: recorded, and the others are scored
            ev.record_unreadable(ckpt, e)
            unreadable.append(f"{ckpt} ({e})")
    if global_rank() == 0:
        ev.store.export_csv()
        write_report(cfg.out)
    if unreadable:
        raise WorkbenchError(f"{len(unreadable)} of {len(checkpoints)} checkpoints could not be scored (recorded as "
                             f"unreadable in {ev.store.path}): {'; '.join(unreadable)}")
    return rows
