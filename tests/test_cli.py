"""The `dwb` console script as users run it: one-line errors, tracebacks only with --debug.

Two tests start the console script itself; the others call its `main` in this process (the same code
after the entry point, without the 5-10 s of imports each new process pays)."""
import itertools
import re

import pytest

from .conftest import REPO, run_dwb


def readme_commands() -> list[tuple[list[str], list[str]]]:
    """(command words, options) of each row of the README's command table: `dwb data shapes OUT [--n N ...]`."""
    rows = re.findall(r"^\| `dwb ([^`]+)` \|", (REPO / "README.md").read_text(), flags=re.MULTILINE)
    assert len(rows) >= 10, "the README's command table was not found"
    commands = []
    for row in rows:
        words = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z][a-z-]*", w), row.split()))
        commands.append((words, re.findall(r"--[a-z][a-z-]*", row)))
    return commands


@pytest.mark.parametrize("words, options", readme_commands(), ids=lambda v: " ".join(v) if v else "-")
def test_each_readme_command_exists_and_takes_its_options(words, options, capsys):
    from dwb import main

    with pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith(f"usage: dwb {' '.join(words)}")
    assert [o for o in options if o not in out] == []  # every option the README shows is one the command takes


def test_the_readme_lists_every_command():
    import argparse

    from dwb import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {words[0] for words, _ in readme_commands()} == set(sub.choices)


def test_unknown_config_key_is_one_line(dwb):
    r = dwb("train", "configs/tiny-phase1.yaml", "model.colour=red")
    assert r.returncode == 1
    from dataclasses import fields

    from train.config import ModelConfig

    known = ", ".join(sorted(f.name for f in fields(ModelConfig)))
    assert r.stderr.strip() == f"error: unknown config key 'model.colour' (known: {known})"
    assert "caption_dropout" in known and "colour" not in known
    assert "Traceback" not in r.stderr


def test_debug_shows_the_traceback():
    r = run_dwb("--debug", "train", "configs/tiny-phase1.yaml", "model.colour=red")
    assert r.returncode != 0 and "Traceback" in r.stderr and "WorkbenchError" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["train", "configs/nope.yaml"], "error: config file not found: configs/nope.yaml"),
    (["export", "missing.pt", "out"], "error: checkpoint not found: missing.pt"),
    (["prepare", "no-such-data", "out"], "error: no MDS dataset at no-such-data"),
    (["data", "convert", "./no-such-folder", "out"], "./no-such-folder"),
])
def test_bad_paths_are_named(args, needle, dwb):
    r = dwb(*args)
    assert r.returncode == 1 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_pretrained_weights_named(tmp_path, dwb):
    r = dwb("train", "configs/tiny-phase1.yaml", f"model.pretrained={tmp_path}/parts", f"save_folder={tmp_path}/c")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: pretrained VAE not found: {tmp_path}/parts/vae does not exist (run `dwb prepare` to build the tiny components)"


def test_data_shapes_writes_buckets(tmp_path):
    r = run_dwb("data", "shapes", str(tmp_path / "s"), "--n", "12", "--n-eval", "3", "--sizes", "16,32")
    assert r.returncode == 0, r.stderr
    from models.datasets.mds import count_samples

    assert count_samples(tmp_path / "s" / "16") == count_samples(tmp_path / "s" / "32") == 12
    assert count_samples(tmp_path / "s" / "eval" / "32") == 3
    again = run_dwb("data", "shapes", str(tmp_path / "s"), "--n", "12")
    assert again.returncode == 1 and "already holds an MDS dataset" in again.stderr  # nothing overwritten


def test_bad_sizes_are_refused(tmp_path, dwb):
    r = dwb("data", "shapes", str(tmp_path / "s"), "--sizes", "20")
    assert r.returncode == 2 and "multiples of 8" in r.stderr
