"""A checkpoint carries the generation settings it is meant to be sampled at, and its previews name their weights.

One short tiny run (2 batches, a preview and a checkpoint at batch 2) whose previews draw at guidance 3 and
4 steps: every checkpoint of the run recommends those, `dwb sample` without flags starts from them and says so,
and `dwb export` carries them to a diffusers folder and a single file that plain diffusers still loads."""
import json

import pytest
from PIL import Image

from train.config import load_config
from train.trainer import train

from ..conftest import REPO, tiny_overrides

PHASE1 = REPO / "configs/tiny-phase1.yaml"
PROMPT = "a red circle"


@pytest.fixture(scope="module")
def run(shapes_data, components, tmp_path_factory):
    folder = tmp_path_factory.mktemp("recommended") / "run" / "checkpoints"
    train(load_config(PHASE1, tiny_overrides(
        shapes_data, components, folder, max_duration="2ba", save_interval="2ba", preview_interval="2ba",
        eval_interval="null", **{"previews.guidance": 3, "previews.steps": 4, "previews.prompts": f"[{PROMPT}]",
                                 "previews.seeds": "[0]", "previews.ema": "true"})))
    return folder


def record(path) -> dict:
    with Image.open(path) as image:
        return json.loads(image.info["dwb"])


def sample(dwb, ref, out, *flags):
    r = dwb("sample", str(ref), str(out), "--prompt", PROMPT, "--seeds", "1", *flags)
    assert r.returncode == 0, r.stderr
    return r


def test_dwb_sample_without_flags_starts_from_the_checkpoints_recommended_settings_and_says_so(run, dwb, tmp_path):
    ckpt = run / "ep0-ba2-rank0.pt"
    r = sample(dwb, ckpt, tmp_path / "grid.png")
    assert "guidance 3, 4 steps: the checkpoint's recommended settings" in r.stdout
    made = record(tmp_path / "grid.png")
    assert (made["guidance"], made["steps"]) == (3.0, 4)

    r = sample(dwb, ckpt, tmp_path / "chosen.png", "--guidance", "5")  # a value given wins; the rest still said
    assert "4 steps: the checkpoint's recommended setting" in r.stdout and "guidance 3" not in r.stdout
    made = record(tmp_path / "chosen.png")
    assert (made["guidance"], made["steps"]) == (5.0, 4)


def test_export_carries_the_settings_to_a_folder_and_a_single_file_plain_diffusers_still_loads(run, dwb, tmp_path):
    from diffusers import DiffusionPipeline, StableDiffusionPipeline
    from safetensors import safe_open

    ckpt = run / "ep0-ba2-rank0.pt"
    folder = tmp_path / "folder"
    r = dwb("export", str(ckpt), str(folder), "--settings", "steps=3,sampler=Euler")
    assert r.returncode == 0, r.stderr
    assert json.loads((folder / "recommended_settings.json").read_text()) == {"guidance": 3.0, "steps": 3,
                                                                              "sampler": "Euler", "size": 16}
    DiffusionPipeline.from_pretrained(folder, local_files_only=True)  # diffusers ignores the file
    r = sample(dwb, folder, tmp_path / "from-folder.png")
    assert "guidance 3, 3 steps, Euler, 16 px: the checkpoint's recommended settings" in r.stdout  # its trained size
    made = record(tmp_path / "from-folder.png")
    assert (made["guidance"], made["steps"], made["sampler"]) == (3.0, 3, "Euler")

    single = tmp_path / "tiny.safetensors"
    r = dwb("export", str(folder), str(single), "--settings", "guidance=2.5")  # over the folder's own
    assert r.returncode == 0, r.stderr
    with safe_open(str(single), "pt") as f:
        spec = json.loads(f.metadata()["dwb.spec"])
    assert spec["recommended"] == {"guidance": 2.5, "steps": 3, "sampler": "Euler", "size": 16}
    StableDiffusionPipeline.from_single_file(str(single), config=str(tmp_path / "tiny.config"), local_files_only=True,
                                             safety_checker=None, requires_safety_checker=False)
    sample(dwb, single, tmp_path / "from-file.png")
    made = record(tmp_path / "from-file.png")
    assert (made["guidance"], made["steps"], made["sampler"]) == (2.5, 3, "Euler")


@pytest.mark.parametrize("settings, message", [
    ("cfg=3", "--settings: unknown setting 'cfg'; the settings are guidance, steps, sampler, size"),
    ("steps=many", "--settings: steps must be a whole number from 1 to 150, got 'many'"),
    ("guidance=31", "--settings: guidance must be a number from 0 to 30, got '31'"),
    ("sampler=Fastest", "--settings: unknown sampler 'Fastest'; choose one of: DDIM"),
    ("size=100", "--settings: size must be a multiple of 8 from 16 to 1024, got '100'"),
    ("steps", "--settings: expected key=value such as guidance=3, got 'steps'"),
])
def test_bad_export_settings_are_one_line_and_nothing_is_written(run, dwb, tmp_path, settings, message):
    r = dwb("export", str(run / "ep0-ba2-rank0.pt"), str(tmp_path / "out"), "--settings", settings)
    assert r.returncode != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_folders_settings_file_from_elsewhere_is_read_bounded_and_checked(run, dwb, tmp_path):
    folder = tmp_path / "folder"
    assert dwb("export", str(run / "ep0-ba2-rank0.pt"), str(folder)).returncode == 0
    for text, message in [('{"steps": 100000}', "steps must be a whole number from 1 to 150"),
                          ("[" * 5000 + "]" * 5000, "nested"), ('{"seed": 1}', "unknown setting 'seed'")]:
        (folder / "recommended_settings.json").write_text(text)
        r = dwb("sample", str(folder), str(tmp_path / "grid.png"), "--seeds", "1")
        assert r.returncode != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "grid.png").exists()


def test_a_preview_names_the_weights_it_was_drawn_from(run):
    """A preview's Model hash is the fingerprint of the UNet it drew with: the same weights opened from the
    checkpoint saved at that batch (EMA, as the preview drew) give the same one."""
    from models.checkpoints import fingerprint, load_pipeline
    from models.generation import parse_parameters

    with Image.open(run.parent / "previews" / "ba2.png") as preview:
        shown = parse_parameters(preview.info["parameters"])["Model hash"]
        recorded = json.loads(preview.info["dwb"])["checkpoint_hash"]
    assert len(shown) == 16 and shown == recorded == fingerprint(load_pipeline(run / "ep0-ba2-rank0.pt", ema=True).unet)


def test_the_apps_generate_tab_starts_from_them_when_a_checkpoint_is_chosen(run):
    from app.handlers import Handlers
    from app.service import Service

    handlers = Handlers(Service([run], cache_size=1))
    note = handlers.checkpoint_note("ep0-ba2-rank0.pt")[0]
    assert "guidance 3, 4 steps: the checkpoint's recommended settings" in note
    sampler, steps, guidance = handlers.recommended_controls("ep0-ba2-rank0.pt")
    assert (steps["value"], guidance["value"]) == (4, 3.0) and "value" not in sampler  # none recommended: kept


def test_evaluates_sample_sets_start_from_them(run, shapes_data, inception_weights, tmp_path, capsys):
    from evaluate.run import EvalConfig, evaluate_checkpoints
    from evaluate.samples import read_manifest

    cfg = EvalConfig(out=str(tmp_path / "eval"), reference=str(shapes_data / "eval/32"),
                     inception_weights=str(inception_weights), inception_features=64, prompts="shapes", n_prompts=2,
                     n_reference=16, guidance=(3.0,), bootstrap=0, kid_subsets=2, kid_subset_size=2, device="cpu",
                     progress=False)
    [row] = evaluate_checkpoints(cfg, [run / "ep0-ba2-rank0.pt"])
    said = capsys.readouterr().out
    assert "4 steps: the checkpoint's recommended setting" in said and "guidance 3" not in said  # 3 was chosen
    assert row["steps"] == 4
    first = read_manifest(tmp_path / "eval" / row["samples"] / "manifest.jsonl")[0]
    assert record(tmp_path / "eval" / row["samples"] / first["path"])["steps"] == 4
