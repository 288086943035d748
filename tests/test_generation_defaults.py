"""One set of generation defaults (``train.generation.defaults``): `dwb sample`, the app and `dwb evaluate`'s sample
sets make the same checkpoint's images with the same guidance, steps, sampler, size and weights when nobody
chooses, as each output's PNG parameters say."""
import json

from PIL import Image

from train.generation import DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS

SETTINGS = ("guidance", "steps", "sampler", "width", "height", "weights")


def recorded(image: Image.Image) -> dict:
    """The settings an image's ``dwb`` PNG text holds."""
    record = json.loads(image.info["dwb"])
    return {key: record[key] for key in SETTINGS}


def test_sample_the_app_and_evaluate_generate_with_the_same_defaults(tiny_run, shapes_data, inception_weights,
                                                                     tmp_path, dwb):
    from app.generate import GenerationParams
    from app.handlers import Handlers
    from app.service import Service
    from evaluate.config import GUIDANCE_SWEEP
    from evaluate.run import EvalConfig, evaluate_checkpoints
    from evaluate.samples import read_manifest

    ckpt = tiny_run / "ep0-ba4-rank0.pt"  # EMA from the first batch, 16 px
    # evaluate's sample set at the sweep's scale that the other commands use; every other setting its default
    assert DEFAULT_GUIDANCE in GUIDANCE_SWEEP
    cfg = EvalConfig(out=str(tmp_path / "eval"), reference=str(shapes_data / "eval/32"),
                     inception_weights=str(inception_weights), inception_features=64, prompts="shapes", n_prompts=2,
                     n_reference=16, guidance=(DEFAULT_GUIDANCE,), bootstrap=0, kid_subsets=2, kid_subset_size=2,
                     device="cpu", progress=False)
    [row] = evaluate_checkpoints(cfg, [ckpt])
    first = read_manifest(tmp_path / "eval" / row["samples"] / "manifest.jsonl")[0]
    with Image.open(tmp_path / "eval" / row["samples"] / first["path"]) as im:
        evaluated = recorded(im)

    service = Service([tiny_run], cache_size=1)
    size = Handlers(service).default_size([ckpt.name])  # where the app's width and height start
    made = service.generate(ckpt.name, DEFAULT_WEIGHTS,
                            GenerationParams(first["prompt"], seed=first["seed"], width=size, height=size))
    app = recorded(made.images[0])

    r = dwb("sample", str(ckpt), str(tmp_path / "grid.png"), "--prompt", first["prompt"], "--seeds", "1")
    assert r.returncode == 0, r.stderr
    with Image.open(tmp_path / "grid.png") as im:
        sampled = recorded(im)
        assert json.loads(im.info["dwb"])["grid"] == {"prompts": [first["prompt"]], "seeds": [0]}

    defaults = {"guidance": DEFAULT_GUIDANCE, "steps": DEFAULT_STEPS, "sampler": DEFAULT_SAMPLER, "width": 16,
                "height": 16, "weights": "ema"}
    assert sampled == app == evaluated == defaults
    assert "ema weights, guidance 7.5, 25 steps, DPM++ 2M, 16 px" in r.stdout
    assert {k: row[k] for k in ("guidance", "steps", "sampler", "size", "weights")} == {
        "guidance": 7.5, "steps": 25, "sampler": "DPM++ 2M", "size": 16, "weights": "ema"}
