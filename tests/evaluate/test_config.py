"""`dwb evaluate`'s typed config: a YAML file, flags and key=value overrides give one EvalConfig; a bad key or
value is one line naming it, before anything is scored."""
import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from dwb import build_parser, main
from evaluate.cli import config_from_args
from evaluate.config import EvalConfig, load_eval_config

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "configs" / "evaluate-shapes.yaml"

# every key set away from its default, as a user types it: flag, and the same value as YAML
EVERY_KEY = [("out", "o", "o"), ("reference", "r", "r"), ("inception_weights", "w.pth", "w.pth"),
             ("scorer", "s.pt", "s.pt"), ("prompts", "shapes", "shapes"), ("n_prompts", "8", 8),
             ("n_per_prompt", "2", 2), ("n_reference", "16", 16), ("guidance", "3,5.5", [3, 5.5]), ("steps", "4", 4),
             ("sampler", "DPM++ 2M Karras", "DPM++ 2M Karras"), ("size", "16", 16), ("batch_size", "4", 4),
             ("seed", "3", 3), ("clip", "c", "c"), ("cmmd", None, True), ("dinov2", "d", "d"), ("bootstrap", "0", 0),
             ("weights", "ema", "ema"), ("ema", None, True), ("kid_subsets", "3", 3), ("kid_subset_size", "4", 4),
             ("inception_features", "64", 64), ("device", "cpu", "cpu"), ("dtype", "fp32", "fp32"),
             ("allow_fewer_reference", None, True), ("cache", "cache", "cache"), ("pickscore", "p", "p"),
             ("hps", "h.pt", "h.pt"), ("imagereward", "ir", "ir"), ("aesthetic", "a.pth", "a.pth"),
             ("parts", "parts-folder", "parts-folder"), ("aspect", "16:9", "16:9"), ("aspect_column", "ratio", "ratio")]


def one_line_error(argv: list[str], capsys) -> str:
    """What `dwb evaluate ARGV` prints: it must fail with exactly one line."""
    assert main(["evaluate", *argv]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def config_of(command: str, *argv: str) -> EvalConfig:
    return config_from_args(build_parser().parse_args(["evaluate", command, *argv]), scoring=command != "compare")


def test_the_shipped_config_loads_as_written():
    cfg = load_eval_config(SHAPES)
    written = yaml.safe_load(SHAPES.read_text())
    for key, value in written.items():
        assert getattr(cfg, key) == (tuple(value) if isinstance(value, list) else value), key
    assert cfg.guidance == (3.0, 5.0) and cfg.scorer == "demo-output/scorer.pt" and cfg.weights == "auto"


def test_every_key_is_documented():
    text = (REPO / "docs" / "evaluate.md").read_text()
    section = text[text.index("## Config files"):]
    section = section[:section.index("\n## ")]
    assert [f.name for f in fields(EvalConfig) if f"`{f.name}`" not in section] == []


def test_flags_the_file_and_key_value_give_the_same_config(tmp_path):
    flags = [a for key, flag, _ in EVERY_KEY for a in (f"--{key.replace('_', '-')}", *([flag] if flag else []))]
    file = tmp_path / "every.yaml"
    file.write_text(yaml.safe_dump({key: value for key, _, value in EVERY_KEY}))
    from_flags = config_of("run", "ck.pt", *flags)
    assert from_flags == config_of("run", "ck.pt", "--config", str(file))
    assert from_flags == config_of("run", "ck.pt", *(f"{key}={v if isinstance(v, str) else json.dumps(v)}"
                                                     for key, _, v in EVERY_KEY))
    at_default = [f.name for f in fields(EvalConfig) if getattr(from_flags, f.name) == f.default]
    assert at_default == ["progress"]  # not a flag; every other key was given


def test_a_preference_flag_alone_loads_the_published_weights():
    cfg = config_of("run", "ck.pt", "--out", "o", "--reference", "r", "--pickscore", "--hps", "--imagereward", "--aesthetic")
    assert (cfg.pickscore, cfg.hps, cfg.imagereward, cfg.aesthetic) == (
        "yuvalkirstain/PickScore_v1", "xswu/HPSv2", "THUDM/ImageReward", "sac+logos+ava1-l14-linearMSE.pth")
    assert config_of("run", "ck.pt", "--out", "o", "--reference", "r").pickscore is None  # not asked: not scored


def test_flags_and_key_value_win_over_the_file():
    cfg = config_of("run", "a.pt", "b.pt", "--config", str(SHAPES), "--steps", "7", "guidance=[1.5, 8]", "sampler=DDIM")
    assert (cfg.steps, cfg.guidance, cfg.sampler, cfg.n_prompts) == (7, (1.5, 8.0), "DDIM", 256)
    assert config_of("run", "a.pt", "--config", str(SHAPES), "--steps", "7", "steps=9").steps == 9  # key=value last
    args = build_parser().parse_args(["evaluate", "run", "a.pt", "steps=3", "b.pt", "--config", str(SHAPES), "seed=4"])
    cfg = config_from_args(args)
    assert args.checkpoints == ["a.pt", "b.pt"] and (cfg.steps, cfg.seed) == (3, 4)
    # after an option too (argparse alone gives positionals only their first run of arguments)
    assert config_of("watch", "runs/x", "--config", str(SHAPES), "steps=11").steps == 11
    assert config_of("compare", "a", "b", "--out", "o", "bootstrap=1000").bootstrap == 1000
    assert config_of("compare", "a", "b", "--config", str(SHAPES)).reference == "demo-output/shapes/eval/32"


@pytest.mark.parametrize("arg, message", [
    ("colour=red", "error: unknown config key 'colour' (known: aesthetic, allow_fewer_reference, aspect, "
                   "aspect_column, batch_size, "
                   "bootstrap, cache, clip, cmmd, device, dinov2, dtype, ema, guidance, hps, imagereward, "
                   "inception_features, inception_weights, kid_subset_size, kid_subsets, n_per_prompt, n_prompts, "
                   "n_reference, out, parts, pickscore, progress, prompts, reference, sampler, scorer, seed, size, steps, "
                   "weights)"),
    ("steps=many", "error: config key 'steps' must be int or NoneType, got 'many'"),
    ("steps=0", "error: config key 'steps' must be a positive integer, got 0"),
    ("guidance=7.5", "error: config key 'guidance' must be a list, got 7.5"),
    ("guidance=[3, -1]", "error: config key 'guidance' must be non-negative guidance scales, got [3.0, -1.0]"),
    ("bootstrap=1", "error: config key 'bootstrap' must be 0 (no intervals) or at least 2 replicates, got 1"),
    ("seed=-1", "error: config key 'seed' must be >= 0, got -1"),
    ("inception_features=100", "error: config key 'inception_features' must be one of 64, 192, 768, 2048, got 100"),
    ("ema=maybe", "error: config key 'ema' must be bool or NoneType, got 'maybe'"),
    ("weights=best", "error: config key 'weights' must be one of auto, ema, raw, got 'best'"),
    ("sampler=Karras 9000", "error: unknown sampler 'Karras 9000'; choose one of: DDIM, Euler"),
    ("scheduler=DDIM", "error: unknown config key 'scheduler'"),
])
def test_a_bad_key_or_value_is_one_line_and_nothing_is_written(arg, message, tmp_path, capsys):
    file = tmp_path / "sweep.yaml"
    file.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "reference": "r", "scorer": "s.pt"}))
    assert one_line_error(["run", "ck.pt", "--config", str(file), arg], capsys).startswith(message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, message", [
    ("colour: red\n", "error: unknown config key 'colour'"),
    ("out: o\n", "error: config key 'reference' is required"),
    ("out: o\nreference: r\nn_prompts: [1]\n", "error: config key 'n_prompts' must be int or NoneType, got [1]"),
    ("- a list\n", "must hold a mapping at the top level"),
])
def test_a_bad_file_is_named(text, message, tmp_path, capsys):
    file = tmp_path / "sweep.yaml"
    file.write_text(text)
    assert message in one_line_error(["watch", "runs/x", "--config", str(file)], capsys)


def test_a_missing_file_is_named(tmp_path, capsys):
    error = one_line_error(["run", "ck.pt", "--config", str(tmp_path / "nope.yaml")], capsys)
    assert error.strip() == f"error: config file not found: {tmp_path / 'nope.yaml'}"


def test_run_with_only_overrides_names_the_missing_checkpoint(tmp_path, capsys):
    """`run steps=5 ...` parses (key=value may stand among the checkpoints), but then holds no checkpoint."""
    file = tmp_path / "sweep.yaml"
    file.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "reference": "r", "scorer": "s.pt"}))
    error = one_line_error(["run", "steps=5", "--config", str(file)], capsys)
    assert error.strip() == "error: give at least one checkpoint to score (every argument was a key=value override)"
    assert not (tmp_path / "out").exists()
