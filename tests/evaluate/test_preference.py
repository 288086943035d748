"""The human-preference scores equal their authors' own scoring code on the same weights and images.

Each model's weights are random and seeded, in its published file layout, at small widths where the
published sizes would take minutes on a CPU (each fixture says which). The references:
- HPSv2.1: ``hpsv2.img_score.score`` of the ``hpsv2`` 1.2.0 package, unchanged (its model built by its own
  ``create_model_and_transforms`` at the fixture's sizes, which ``score`` then loads the checkpoint into).
- ImageReward: ``ImageReward.utils.load`` and ``ImageReward.score`` of the ``image-reward`` 1.5 package,
  unchanged, building the fixture's sizes.
- PickScore: the transformers snippet of its model card (yuvalkirstain/PickScore_v1, "Example usage").
- The aesthetic predictor: its published ``simple_inference.py`` (christophschuhmann/improved-aesthetic-
  predictor): its five-layer ``MLP`` on the unit-norm image embedding of open_clip's own model, preprocessed by
  open_clip's own transform; our scorer reads the same weights converted into a transformers CLIP folder.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from evaluate.prompts import shapes_prompts
from evaluate.scorers.preference import to_pil
from models.errors import WorkbenchError

from .preference_fixtures import (hpsv2_package, test_images, write_hps, write_image_reward,
                                  write_open_clip_as_transformers, write_pickscore)

test_images.__test__ = False
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def captions() -> list[str]:
    return [p.text for p in shapes_prompts(4)]


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return test_images(4)


def _tells_apart(ours: np.ndarray, swapped: np.ndarray) -> None:
    """A fixture that can tell right from wrong: images score apart, and another caption changes a score,
    each by far more than the tolerance."""
    assert np.ptp(ours) > 1000 * TOLERANCE, ours
    assert np.abs(ours - swapped).max() > 1000 * TOLERANCE, (ours, swapped)


def _swap(captions: list[str]) -> list[str]:
    return captions[1:] + captions[:1]


@pytest.fixture(scope="module")
def hps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hps")
    reference, factory = hpsv2_package(tmp / "package")
    return reference, factory, write_hps(tmp, factory)


def test_hps_equals_the_hpsv2_package(hps, images, captions):
    from evaluate.scorers.hps import HpsScorer

    reference, factory, path = hps
    model, _, preprocess_val = factory.create_model_and_transforms("tiny-ViT-H-14", None, **hps_args())
    reference.model_dict.update(model=model, preprocess_val=preprocess_val)  # what initialize_model would keep
    try:
        theirs = np.array([reference.score(im, c, cp=str(path), hps_version="v2.1")[0]
                           for im, c in zip(to_pil(images), captions)])
    finally:
        reference.model_dict.clear()
    scorer = HpsScorer(path.parent)
    ours = scorer(images, captions).numpy()
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    _tells_apart(ours, scorer(images, _swap(captions)).numpy())
    assert scorer.model.visual.transformer.resblocks[0].attn.num_heads == 2  # 160 / ViT-H-14's 80-wide heads


def hps_args():
    from .preference_fixtures import HPS_ARGS

    return HPS_ARGS


@pytest.fixture(scope="module")
def image_reward(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imagereward")
    words = " ".join(p.text for p in shapes_prompts(64)).replace(",", " ").split()
    return (folder, *write_image_reward(folder, words))


def test_imagereward_equals_the_image_reward_package(image_reward, images, captions):
    from evaluate.scorers.imagereward import ImageRewardScorer

    folder, load, sizes = image_reward
    with sizes():
        model = load(str(folder / "ImageReward.pt"), device="cpu", med_config=str(folder / "med_config.json")).eval()
        theirs = np.array([model.score(c, im) for im, c in zip(to_pil(images), captions)])
    scorer = ImageRewardScorer(folder)
    ours = scorer(images, captions).numpy()
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    _tells_apart(ours, scorer(images, _swap(captions)).numpy())


@pytest.fixture(scope="module")
def tiny_pickscore(components, tmp_path_factory):
    return write_pickscore(tmp_path_factory.mktemp("pickscore"), components / "tokenizer")


def test_pickscore_equals_its_model_cards_snippet(tiny_pickscore, images, captions):
    from transformers import AutoModel, AutoProcessor

    from evaluate.scorers.pickscore import PickScorer

    processor, model = AutoProcessor.from_pretrained(tiny_pickscore), AutoModel.from_pretrained(tiny_pickscore).eval()
    theirs = []
    for image, prompt in zip(to_pil(images), captions):  # the card's calc_probs, one image per prompt, no softmax
        image_inputs = processor(images=[image], padding=True, truncation=True, max_length=77, return_tensors="pt")
        text_inputs = processor(text=prompt, padding=True, truncation=True, max_length=77, return_tensors="pt")
        with torch.no_grad():
            image_embs = model.get_image_features(**image_inputs)
            image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
            text_embs = model.get_text_features(**text_inputs)
            text_embs = text_embs / torch.norm(text_embs, dim=-1, keepdim=True)
            theirs.append((model.logit_scale.exp() * (text_embs @ image_embs.T)[0]).item())
    scorer = PickScorer(tiny_pickscore)
    ours = scorer(images, captions).numpy()
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    _tells_apart(ours, scorer(images, _swap(captions)).numpy())


class PublishedMLP(torch.nn.Module):
    """simple_inference.py's ``MLP`` (a LightningModule there; its forward is ``self.layers(x)``)."""

    def __init__(self, input_size):
        super().__init__()
        nn = torch.nn
        self.layers = nn.Sequential(nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128),
                                    nn.Dropout(0.2), nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16),
                                    nn.Linear(16, 1))

    def forward(self, x):
        return self.layers(x)


def write_aesthetic_head(folder, dim: int):
    """``sac+logos+ava1-l14-linearMSE.pth``'s layout for ``dim``-d embeddings (published: 768-d), initialised as
    trained heads are scaled (std 1 / sqrt(fan-in)), seeded."""
    torch.manual_seed(3)
    head = PublishedMLP(dim)
    with torch.no_grad():
        for layer in head.layers:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.normal_(0, layer.in_features ** -0.5)
    path = folder / "sac+logos+ava1-l14-linearMSE.pth"
    torch.save(head.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def aesthetic_head(tiny_clip, tmp_path_factory):
    """The head for the tiny CLIP's 16-d embeddings, for the runs that score with the run's own CLIP."""
    return write_aesthetic_head(tmp_path_factory.mktemp("aesthetic"), 16)


# open_clip's ViT-S-32 is OpenAI's CLIP ViT with ViT-L/14's 224 px preprocessing at 384 wide and 32 px patches:
# open_clip's ViT-L-14 took 14 s to build and run on the four images on a 2-core CPU, and again as much for ours
OPEN_CLIP_CONFIG = "ViT-S-32"


@pytest.fixture(scope="module")
def open_clip_aesthetic(components, tmp_path_factory) -> SimpleNamespace:
    """open_clip's own model (random weights, seeded, QuickGELU as OpenAI's ViT-L/14) and preprocessing, the same
    weights as a transformers CLIP folder for our scorer, and a head for its embedding width."""
    import open_clip

    torch.manual_seed(4)
    model, _, preprocess = open_clip.create_model_and_transforms(OPEN_CLIP_CONFIG, pretrained=None,
                                                                 force_quick_gelu=True)
    folder = tmp_path_factory.mktemp("open-clip")
    clip = write_open_clip_as_transformers(model.eval(), OPEN_CLIP_CONFIG, folder / "clip", components / "tokenizer")
    dim = open_clip.get_model_config(OPEN_CLIP_CONFIG)["embed_dim"]
    return SimpleNamespace(model=model, preprocess=preprocess, clip=clip, head=write_aesthetic_head(folder, dim),
                           dim=dim)


def normalized(a, axis=-1, order=2):
    """simple_inference.py's ``normalized``, unchanged."""
    l2 = np.atleast_1d(np.linalg.norm(a, order, axis))
    l2[l2 == 0] = 1
    return a / np.expand_dims(l2, axis)


def test_aesthetic_equals_the_published_predictor(open_clip_aesthetic, images, captions):
    """simple_inference.py's path with open_clip in place of OpenAI's ``clip`` package (its ``clip.load``
    returns the same model and preprocessing): each PIL image through open_clip's own transform and
    ``encode_image``, ``normalized``, then the published MLP."""
    from evaluate.scorers.aesthetic import AestheticScorer

    ref = open_clip_aesthetic
    mlp = PublishedMLP(ref.dim)
    mlp.load_state_dict(torch.load(ref.head))
    mlp.eval()
    theirs = []
    for pil_image in to_pil(images):
        with torch.no_grad():
            image_features = ref.model.encode_image(ref.preprocess(pil_image).unsqueeze(0))
        im_emb_arr = normalized(image_features.cpu().detach().numpy())
        theirs.append(mlp(torch.from_numpy(im_emb_arr).type(torch.FloatTensor)).item())
    scorer = AestheticScorer(ref.head, clip=str(ref.clip))
    ours = scorer(images, captions).numpy()
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    assert np.ptp(ours) > 1000 * TOLERANCE
    np.testing.assert_array_equal(scorer(images, _swap(captions)).numpy(), ours)  # the caption plays no part


def test_missing_weights_are_one_line_errors_naming_the_download(tmp_path, monkeypatch):
    from evaluate.scorers.aesthetic import AestheticScorer
    from evaluate.scorers.hps import HpsScorer
    from evaluate.scorers.imagereward import ImageRewardScorer
    from evaluate.scorers.pickscore import PickScorer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = [(HpsScorer, tmp_path, "HPS_v2.1_compressed.pt"), (ImageRewardScorer, tmp_path, "ImageReward.pt"),
             (AestheticScorer, tmp_path / "none.pth", "sac+logos+ava1-l14-linearMSE.pth"),
             (PickScorer, tmp_path / "none", "yuvalkirstain/PickScore_v1")]
    for scorer, where, named in cases:
        with pytest.raises(WorkbenchError) as e:
            scorer(where)
        assert named in str(e.value) and "download" in str(e.value) and "\n" not in str(e.value), str(e.value)
    (tmp_path / "HPS_v2.1_compressed.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(WorkbenchError, match="cannot read the HPSv2.1 weights"):
        HpsScorer(tmp_path)


@pytest.mark.slow  # two checkpoints scored by all four, then compared: about 35 s on a busy 2-core machine
def test_run_compare_and_report_carry_the_four_scores(tiny_run, shapes_data, inception_weights, tiny_pickscore, hps,
                                                      image_reward, tiny_clip, aesthetic_head, tmp_path, capsys):
    """`dwb evaluate run --pickscore W --hps W --imagereward W --aesthetic W`, then `compare`: each score per
    image in the manifest, its mean with an interval and per category, a paired difference in its own family."""
    import json

    from dwb import main
    from evaluate.store import ResultsStore

    a, b = tiny_run / "ep0-ba2-rank0.pt", tiny_run / "ep0-ba4-rank0.pt"
    out = tmp_path / "res"
    args = [str(a), str(b), "--out", str(out), "--reference", str(shapes_data / "eval/32"), "--inception-weights",
            str(inception_weights), "--inception-features", "64", "--prompts", "shapes", "--n-prompts", "6",
            "--n-reference", "16", "--guidance", "5", "--steps", "2", "--size", "16", "--batch-size", "6",
            "--kid-subset-size", "6", "--kid-subsets", "2", "--device", "cpu", "--clip", str(tiny_clip),
            "--pickscore", str(tiny_pickscore), "--hps", str(hps[2]), "--imagereward", str(image_reward[0]),
            "--aesthetic", str(aesthetic_head)]
    assert main(["evaluate", "run", *args]) == 0
    printed = capsys.readouterr().out
    keys = ("pickscore", "hps", "imagereward", "aesthetic")
    rows = ResultsStore(out).rows()
    for r in rows:
        manifest = [json.loads(x) for x in (out / r["samples"] / "manifest.jsonl").read_text().splitlines()]
        for k in keys:
            assert r[f"{k}_lo"] <= r[k] <= r[f"{k}_hi"] and r[f"{k}_lo"] < r[f"{k}_hi"], (k, r)
            assert np.mean([m[k] for m in manifest]) == pytest.approx(r[k], abs=1e-5)
            assert all(k in c for c in r["categories"])
        assert set(r["preference_models"]) == set(keys)
    assert all(name in printed for name in ("PickScore", "HPSv2.1", "ImageReward", "aesthetic score"))
    table = json.loads((out / "metrics.json").read_text())
    assert {k: table[k]["family"] for k in keys} == dict.fromkeys(keys, "human preference")
    assert "PickScore" in (out / "report" / "index.html").read_text()
    import csv

    with open(out / "results.csv") as f:
        table_rows = list(csv.DictReader(f))
    assert [float(x["hps_lo"]) for x in table_rows] == pytest.approx([r["hps_lo"] for r in rows])

    assert main(["evaluate", "compare", str(a), str(b), "--out", str(out), "--bootstrap", "50"]) == 0
    [result] = [json.loads(p.read_text()) for p in (out / "compare").glob("*.json")]
    ours = [m for m in result["metrics"] if m["metric"] in keys]
    assert [m["metric"] for m in ours] == list(keys)
    for m in ours:
        assert m["difference"] == pytest.approx(m["b"] - m["a"]) and m["lo"] <= m["difference"] <= m["hi"]
    assert "human preference" in [f["family"] for f in result["overall"]["families"]]
    assert result["replicates"]["human preference"] == 400  # Holm within the family of 4: 80 per metric
