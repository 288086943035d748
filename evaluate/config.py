"""Typed evaluation configuration: YAML on disk, the command line's flags, ``key=value`` overrides.

A key is its flag's name with underscores (``--n-prompts`` is ``n_prompts``, ``--sampler`` is ``sampler``).
The file is read first, then the flags given, then ``key=value`` overrides: the later wins. Loading, types
and unknown keys are ``models.common.typed_config``'s (one machinery for every stage), and so is the check of each key's
value against the rule on its field (``checked``); the same rules check the flags as they are parsed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from models.errors import WorkbenchError
from models.generation import DEFAULT_WEIGHTS, WEIGHT_CHOICES, aspect_problem, check_sampler
from models.common import (NON_NEGATIVE, build_config, check_rules, checked, merge_config, one_of, parse_overrides,
                           read_config_file)

# The default guidance scales: a sweep, which holds the scale every other command generates at by default
# (models.generation.DEFAULT_GUIDANCE, 7.5), so the images users look at are among those scored.
GUIDANCE_SWEEP = (1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5, 8.0)
INCEPTION_FEATURES = (64, 192, 768, 2048)  # Inception's layers: 2048 is pool3, the standard FID
GENERATION_DTYPES = ("auto", "fp32", "bf16", "fp16")  # the flag's choices
# keys whose key=value overrides are taken as written, not as YAML: YAML reads aspect=16:9 as the base-60 number 969
TEXT_KEYS = ("aspect",)


def positive(n: int) -> str | None:
    return None if n > 0 else f"must be a positive integer, got {n}"


def replicates(n: int) -> str | None:
    return None if n == 0 or n >= 2 else f"must be 0 (no intervals) or at least 2 replicates, got {n}"


def guidance_scales(scales: tuple[float, ...]) -> str | None:
    if not scales:
        return "must list at least one guidance scale"
    return None if all(g >= 0 for g in scales) else f"must be non-negative guidance scales, got {list(scales)}"


@dataclass
class EvalConfig:
    out: str
    reference: str
    inception_weights: str | None = None  # Inception features for FID/KID ...
    scorer: str | None = None  # ... or the shapes domain scorer's (domain FID), plus attribute accuracy
    prompts: str = "reference"  # "reference", "shapes", "drawbench", "parti", or a CSV/TSV path
    n_prompts: int | None = checked(1000, positive)
    n_per_prompt: int = checked(1, positive)
    n_reference: int = checked(1000, positive)
    guidance: tuple[float, ...] = checked(GUIDANCE_SWEEP, guidance_scales)
    # None: the checkpoint's recommended steps (models.checkpoints.recommended_settings), else DEFAULT_STEPS
    steps: int | None = checked(None, positive)
    # a name in models.generation.SAMPLERS; None: the checkpoint's recommended sampler, else DEFAULT_SAMPLER, and no
    # folder of its own
    sampler: str | None = None
    parts: str | None = None  # folder or cached hub id: the other parts of the single files scored (as dwb sample's)
    size: int | None = checked(None, positive)  # default: the checkpoint's recommended size, else its native size
    # every prompt drawn at this aspect W:H ("16:9"): the aspect bucket of size x size pixels on the family's step.
    # An integer is only admitted to be refused by its rule with how to write it: YAML reads 16:9 unquoted as 969.
    aspect: str | int | None = checked(None, aspect_problem)
    # each prompt's own aspect, from this column of a CSV/TSV prompts file (an empty cell: ``aspect``, else square)
    aspect_column: str | None = None
    batch_size: int = checked(16, positive)  # generation and feature batches; fixed so features do not depend on it
    seed: int = checked(0, NON_NEGATIVE)  # the bootstrap's numpy generator takes no negative seed
    clip: str | None = None  # folder or hub id; None skips CLIP score
    cmmd: bool = False  # CMMD on the CLIP model's image embeddings (needs clip)
    dinov2: str | None = None  # folder or cached hub id of a DINOv2 model: FD-DINOv2, precision/recall/density/coverage
    # human-preference scores (evaluate/scorers/preference.py): each the weights' file, folder or hub id; None skips it
    pickscore: str | None = None
    hps: str | None = None
    imagereward: str | None = None
    aesthetic: str | None = None  # the head's file; on --clip's image embeddings when ViT-L/14, else OpenAI's
    bootstrap: int = checked(200, replicates)  # bootstrap replicates for the 95% intervals; 0: none
    weights: str = checked(DEFAULT_WEIGHTS, one_of(*WEIGHT_CHOICES))  # auto: EMA where the checkpoint holds them
    ema: bool | None = None  # the older key: true is weights ema, false is weights raw
    kid_subsets: int = checked(100, positive)
    kid_subset_size: int = checked(1000, positive)
    inception_features: int = checked(2048, one_of(*INCEPTION_FEATURES))
    # dtype and device are checked where they are resolved (models.generation.device), before anything is scored
    device: str = "auto"
    dtype: str = "auto"  # generation precision (models.generation.pipeline_dtype): auto = bf16 on a GPU, fp32 on a CPU
    allow_fewer_reference: bool = False
    cache: str | None = None  # reference statistics; default OUT/cache
    progress: bool = True


def check_eval_config(cfg: EvalConfig) -> EvalConfig:
    """Every value within its field's rule (``models.common.typed_config.check_rules``); one line naming the key."""
    check_rules(cfg)
    if cfg.sampler is not None:
        check_sampler(cfg.sampler)
    weights_choice(cfg)
    return cfg


def weights_choice(cfg: EvalConfig) -> str:
    """Which weights to score ("auto", "ema", "raw"): ``weights``, or what the older ``ema`` key says."""
    if cfg.ema is None:
        return cfg.weights
    older = "ema" if cfg.ema else "raw"
    if cfg.weights not in (DEFAULT_WEIGHTS, older):
        raise WorkbenchError(f"ema: {str(cfg.ema).lower()} and weights: {cfg.weights} disagree: give weights alone")
    return older


def load_eval_config(path: str | Path | None, flags: dict | None = None, overrides: list[str] = (),
                     base: dict | None = None) -> EvalConfig:
    """An EvalConfig from ``base``, then the YAML file, the flags given and ``key=value`` overrides (the later
    wins): unknown keys, wrong types and values out of range refused by name."""
    data = merge_config(merge_config(base or {}, read_config_file(path)), flags or {})
    as_written = {k.strip(): v.strip() for k, _, v in (o.partition("=") for o in overrides) if k.strip() in TEXT_KEYS}
    data = merge_config(data, parse_overrides([o for o in overrides if o.partition("=")[0].strip() not in TEXT_KEYS]))
    return check_eval_config(build_config(EvalConfig, {**data, **as_written}))
