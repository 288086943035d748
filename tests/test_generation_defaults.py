"""One set of generation defaults (``models.generation.defaults``): `dwb sample`, the app and `dwb evaluate`'s sample
sets make the same checkpoint's images with the same guidance, steps, sampler, size and weights when nobody
chooses (the checkpoint's recommended settings first, then the workbench's defaults: ``starting_settings``), as
each output's PNG parameters say."""
import contextlib
import io
import json

import pytest
from PIL import Image

from models.generation import DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS, starting_settings

SETTINGS = ("guidance", "steps", "sampler", "width", "height", "weights")


def recorded(image: Image.Image) -> dict:
    """The settings an image's ``dwb`` PNG text holds."""
    record = json.loads(image.info["dwb"])
    return {key: record[key] for key in SETTINGS}


def help_of(parser, *command: str) -> str:
    """A command's ``--help``, its lines joined."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args([*command, "--help"])
    return " ".join(out.getvalue().split())


def test_each_command_starts_from_the_defaults_or_says_in_its_help_where_it_differs(tiny_run):
    """Each command's effective defaults, read as it reads them: `dwb sample`'s flags, `dwb evaluate run`'s config
    (its sample sets are the ones `dwb human-eval create` builds studies from), the app's controls and `dwb demo`'s
    settings. Evaluate's guidance sweep and the demo's guidance and steps differ: their help says so."""
    from app.service import Service
    from app.ui import build_ui
    from demo.settings import generation
    from dwb import build_parser
    from evaluate.cli import config_from_args
    from evaluate.config import weights_choice
    from models.checkpoints import find_checkpoint, weights_of
    from models.generation import Settings, sampler_of

    parser = build_parser()
    sample = parser.parse_args(["sample", "ckpt", "out.png"])
    started = starting_settings({"guidance": sample.guidance, "steps": sample.steps, "sampler": sample.sampler,
                                 "size": sample.size}, {})[0]  # a checkpoint that recommends nothing
    sampled = {**started, "weights": sample.weights}
    cfg = config_from_args(parser.parse_args(["evaluate", "run", "ckpt", "--out", "o", "--reference", "r"]))
    assert DEFAULT_GUIDANCE in cfg.guidance and len(cfg.guidance) > 1  # a sweep that holds the default
    started = starting_settings({"steps": cfg.steps, "sampler": cfg.sampler, "size": cfg.size}, {})[0]
    evaluated = {"guidance": DEFAULT_GUIDANCE, "steps": started["steps"],
                 "sampler": sampler_of(Settings(sampler=started["sampler"])), "weights": weights_choice(cfg),
                 "size": started["size"]}
    defaults = {"guidance": DEFAULT_GUIDANCE, "steps": DEFAULT_STEPS, "sampler": DEFAULT_SAMPLER,
                "weights": DEFAULT_WEIGHTS, "size": None}
    assert sampled == evaluated == defaults

    blocks, _ = build_ui(Service([tiny_run], cache_size=1))
    control = {c.elem_id: c.value for c in blocks.blocks.values() if getattr(c, "elem_id", None) and hasattr(c, "value")}
    ckpt = find_checkpoint(str(tiny_run / control["checkpoint"]))
    app = {"guidance": control["guidance"], "steps": control["steps"], "sampler": control["sampler"],
           "weights": weights_of(ckpt, control["weights"]), "size": control["width"]}
    assert app == {**defaults, "weights": weights_of(ckpt, DEFAULT_WEIGHTS), "size": 16}  # its native size: 16 px

    demo = generation()
    assert (demo["sampler"], demo["weights"]) == (DEFAULT_SAMPLER, DEFAULT_WEIGHTS)
    assert (demo["guidance"], demo["steps"]) != (DEFAULT_GUIDANCE, DEFAULT_STEPS)
    assert f"at guidance {demo['guidance']:g} (where the tiny model draws best; the workbench's default is " \
           f"{DEFAULT_GUIDANCE:g}), {demo['steps']} steps" in help_of(parser, "demo")
    assert f"which holds {DEFAULT_GUIDANCE:g}, what dwb sample and the app generate at" in \
           help_of(parser, "evaluate", "run")
    shown = help_of(parser, "sample")
    assert f"(default: the checkpoint's recommended, else {DEFAULT_GUIDANCE:g})" in shown
    assert f"(default: the checkpoint's recommended, else {DEFAULT_SAMPLER})" in shown


@pytest.mark.slow
def test_sample_the_app_and_evaluate_generate_with_the_same_defaults(tiny_run, shapes_data, inception_weights,
                                                                     tmp_path, dwb):
    from app.generate import GenerationParams
    from app.handlers import Handlers
    from app.service import Service
    from evaluate.config import GUIDANCE_SWEEP
    from evaluate.run import EvalConfig, evaluate_checkpoints
    from evaluate.samples import read_manifest

    from models.checkpoints import find_checkpoint, recommended_settings

    ckpt = tiny_run / "ep0-ba4-rank0.pt"  # EMA from the first batch, 16 px
    recommended = recommended_settings(find_checkpoint(ckpt))  # its run's previews': guidance 3, 20 steps
    assert recommended == {"guidance": 3.0, "steps": 20}
    # evaluate's sample set at the sweep's scale that the other commands use; every other setting its default
    assert recommended["guidance"] in GUIDANCE_SWEEP
    cfg = EvalConfig(out=str(tmp_path / "eval"), reference=str(shapes_data / "eval/32"),
                     inception_weights=str(inception_weights), inception_features=64, prompts="shapes", n_prompts=2,
                     n_reference=16, guidance=(recommended["guidance"],), bootstrap=0, kid_subsets=2,
                     kid_subset_size=2, device="cpu", progress=False)
    [row] = evaluate_checkpoints(cfg, [ckpt])
    first = read_manifest(tmp_path / "eval" / row["samples"] / "manifest.jsonl")[0]
    with Image.open(tmp_path / "eval" / row["samples"] / first["path"]) as im:
        evaluated = recorded(im)

    service = Service([tiny_run], cache_size=1)
    size = Handlers(service).default_size([ckpt.name])  # where the app's width and height start
    controls = Handlers(service).recommended_controls(ckpt.name)  # sampler, steps, guidance once it is chosen
    started = {k: c["value"] for k, c in zip(("sampler", "steps", "guidance"), controls) if "value" in c}
    made = service.generate(ckpt.name, DEFAULT_WEIGHTS,
                            GenerationParams(first["prompt"], seed=first["seed"], width=size, height=size, **started))
    app = recorded(made.images[0])

    r = dwb("sample", str(ckpt), str(tmp_path / "grid.png"), "--prompt", first["prompt"], "--seeds", "1")
    assert r.returncode == 0, r.stderr
    with Image.open(tmp_path / "grid.png") as im:
        sampled = recorded(im)
        assert json.loads(im.info["dwb"])["grid"] == {"prompts": [first["prompt"]], "seeds": [0]}

    defaults = {"guidance": 3.0, "steps": 20, "sampler": DEFAULT_SAMPLER, "width": 16, "height": 16, "weights": "ema"}
    assert sampled == app == evaluated == defaults
    assert "guidance 3, 20 steps: the checkpoint's recommended settings" in r.stdout
    assert "ema weights, guidance 3, 20 steps, DPM++ 2M, 16 px" in r.stdout
    assert {k: row[k] for k in ("guidance", "steps", "sampler", "size", "weights")} == {
        "guidance": 3.0, "steps": 20, "sampler": "DPM++ 2M", "size": 16, "weights": "ema"}
