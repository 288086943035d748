"""`dwb evaluate watch` with adapters, each checkpoint scored once as it lands, across restarts:

- ``"RUN + FILE@S"``: every checkpoint of a run scored with a LoRA (written by diffusers' ``save_lora_weights``)
  applied, its rows named and hashed as `evaluate run` names ``CHECKPOINT + FILE@S``;
- an adapter run's folder (the session's tiny SD 2 LoRA run, tests/adapters/conftest.py): each adapter checkpoint
  written as AUTOMATIC1111's file (what `dwb export --layout kohya` writes) and scored on the base its spec names,
  at each strength, the row's step that of the adapter checkpoint; a base of another content hash is refused in
  one line."""
from __future__ import annotations

import copy
import shutil

import pytest

from evaluate.store import ResultsStore
from models.adapters import a1111_short_hash
from models.checkpoints import content_hash, find_checkpoint, load_pipeline
from models.families import family_of_pipeline
from models.readers import read_safetensors_head

from .test_applying import _write_diffusers_lora


def _watch(run: str, out, shapes_data, inception_weights, *extra) -> list[str]:
    return ["evaluate", "watch", run, "--out", str(out), "--reference", str(shapes_data / "eval/32"),
            "--inception-weights", str(inception_weights), "--inception-features", "64", "--prompts", "shapes",
            "--n-prompts", "2", "--n-reference", "16", "--guidance", "1", "--steps", "2", "--size", "16",
            "--kid-subset-size", "2", "--kid-subsets", "2", "--bootstrap", "0", "--device", "cpu", "--settle", "0",
            "--max-polls", "1", *extra]


def _short_hash(path) -> str:
    return a1111_short_hash(path, read_safetensors_head(path).header_bytes)


def test_a_run_watched_with_a_lora_scores_each_checkpoint_with_it_once(tiny_run, shapes_data, inception_weights,
                                                                     tmp_path, capsys):
    from dwb import main

    run, out = tmp_path / "run", tmp_path / "res"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(tiny_run / "ep0-ba2-rank0.pt", run / "checkpoints")
    pipe = load_pipeline(find_checkpoint(tiny_run / "ep0-ba2-rank0.pt"))
    style = _write_diffusers_lora(family_of_pipeline(pipe).name, copy.deepcopy(pipe.unet), tmp_path, "style")
    entry = f"{run} + {style}@0.8"
    assert main(_watch(entry, out, shapes_data, inception_weights)) == 0
    shutil.copy(tiny_run / "ep0-ba4-rank0.pt", run / "checkpoints")  # the next checkpoint lands
    assert main(_watch(entry, out, shapes_data, inception_weights)) == 0  # scores the new one alone
    rows = ResultsStore(out).rows()
    assert [r["step"] for r in rows] == [2, 4] and capsys.readouterr().out.count("scored ") == 2
    for r, name in zip(rows, ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt")):
        base = find_checkpoint(run / "checkpoints" / name)
        assert r["checkpoint"] == f"{base.ref} + {style}@0.8" and r["model"] == f"{base.label} + style@0.8"
        assert r["checkpoint_hash"] == f"{content_hash(base)}+{_short_hash(style)}@0.8"
        assert (r["lora_hashes"], r["lora_strengths"]) == (f"style: {_short_hash(style)}", "style: 0.8")


def test_an_adapter_runs_checkpoints_are_scored_on_their_base_at_each_strength(lora_runs, sd2_folder, shapes_data,
                                                                              inception_weights, tmp_path, capsys):
    from dwb import main

    _, trained = lora_runs("sd2")
    folder, out = tmp_path / "run" / "checkpoints", tmp_path / "res"
    folder.mkdir(parents=True)
    shutil.copy(trained / "ep0-ba4-rank0.pt", folder)  # one checkpoint at two strengths: what each costs, twice
    args = _watch(str(folder.parent), out, shapes_data, inception_weights, "--strengths", "0.5,1")
    assert main(args) == 0
    assert main(args) == 0  # a restart finds nothing new
    rows = ResultsStore(out).rows()
    assert [(r["step"], r["lora_strengths"]) for r in rows] == [(4, "run_ep0-ba4-rank0-ema: 0.5"),
                                                                (4, "run_ep0-ba4-rank0-ema: 1")]
    assert capsys.readouterr().out.count("scored ") == 1
    base = find_checkpoint(sd2_folder)
    exported = tmp_path / "ba4.safetensors"  # the adapter as AUTOMATIC1111 reads it: what `dwb export` writes
    assert main(["export", str(folder / "ep0-ba4-rank0.pt"), str(exported), "--layout", "kohya", "--weights",
                 "ema"]) == 0
    for r in rows:
        assert r["base_hash"] == content_hash(base) and r["base_checkpoint"] == base.ref
        short, strength = _short_hash(exported), r["lora_strengths"].split(": ")[1]
        assert r["lora_hashes"].split(": ")[1] == short
        assert r["checkpoint_hash"] == f"{content_hash(base)}+{short}@{strength}"
    assert rows[0]["fid"] != rows[1]["fid"]  # the strength changes the images

    capsys.readouterr()
    assert main(_watch(str(folder.parent), tmp_path / "other", shapes_data, inception_weights, "--base",
                       str(trained / "ep0-ba2-rank0.pt"))) != 0  # a checkpoint of another content hash
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "give --base" in err, err
    assert not (tmp_path / "other" / "results.jsonl").exists()


@pytest.mark.parametrize("bad", ["1,40", "x"])
def test_strengths_out_of_bounds_are_refused(bad, dwb):
    done = dwb("evaluate", "watch", "runs/x", "--strengths", bad)
    assert done.returncode != 0 and "strengths" in done.stderr
