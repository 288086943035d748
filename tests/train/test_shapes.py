import numpy as np
from streaming import LocalDataset

from models.datasets.mds import count_samples
from models.shapes import ALL_SHAPES, COLORS, make_sample, PALETTE, RELATIONS, SHAPES
from train.shapes import write_shapes_dataset
from models.shapes.grammar import parse_caption, scene_from_meta
from models.shapes.samples import shapes_prompts


def _pixels(sample, size):
    return np.asarray(sample["images"][size])


def test_samples_are_deterministic_by_seed():
    a = [make_sample(5, "train", i, (16, 32)) for i in range(20)]
    b = [make_sample(5, "train", i, (16, 32)) for i in range(20)]
    c = [make_sample(6, "train", i, (16, 32)) for i in range(20)]
    for x, y in zip(a, b):
        assert x["caption"] == y["caption"] and x["meta"] == y["meta"]
        assert np.array_equal(_pixels(x, 32), _pixels(y, 32))
    assert [x["caption"] for x in a] != [x["caption"] for x in c]


def test_train_and_eval_splits_are_disjoint():
    """Held-out scenes are not training scenes: no held-out image equals a training image."""
    train = {_pixels(make_sample(0, "train", i, (16,)), 16).tobytes() for i in range(400)}
    held = [_pixels(make_sample(0, "eval", i, (16,)), 16).tobytes() for i in range(100)]
    assert len(train) > 390  # the scenes themselves differ from one another
    assert not train.intersection(held)
    assert [make_sample(0, "eval", i, (16,))["caption"] for i in range(30)] != \
        [make_sample(0, "train", i, (16,))["caption"] for i in range(30)]


def test_caption_matches_attributes_and_layout():
    for i in range(200):
        s = make_sample(1, "train", i, (32,))
        meta, caption = s["meta"], s["caption"]
        assert caption in meta["captions"]
        for g in meta["groups"]:
            assert g["color"] in COLORS and g["shape"] in SHAPES and g["color"] in caption and g["shape"] in caption
        assert [len(b) for b in meta["boxes"]] == [g["count"] for g in meta["groups"]]
        if meta["relation"]:
            assert meta["relation"] in caption or RELATIONS[meta["relation"]] in caption
            first, second = meta["boxes"]
            axis = 1 if meta["relation"] == "above" else 0  # first group is above / left of the second
            assert max(b[axis + 2] for b in first) <= min(b[axis] for b in second)


def test_image_shows_the_named_colour():
    s = make_sample(2, "train", 0, (32,))
    rgb = _pixels(s, 32).reshape(-1, 3).astype(int)
    target = np.array(COLORS[s["meta"]["groups"][0]["color"]])
    assert (np.abs(rgb - target).sum(axis=1) < 30).sum() >= 4


def test_mds_round_trip_and_disjoint_splits_on_disk(tmp_path):
    write_shapes_dataset(tmp_path, 24, seed=9, sizes=(16, 32), n_eval=12, progress=False)
    assert count_samples(tmp_path / "16") == count_samples(tmp_path / "32") == 24
    assert count_samples(tmp_path / "eval" / "32") == 12
    ds = LocalDataset(local=str(tmp_path / "32"))
    for i in (0, 7, 23):
        want = make_sample(9, "train", i, (32,))
        got = ds[i]
        assert got["caption"] == want["caption"] and got["meta"]["groups"] == want["meta"]["groups"]
        assert np.array_equal(np.asarray(got["image"]), _pixels(want, 32))  # PNG is lossless
    # The held-out folder holds the eval stream's samples, none of them a training image.
    held = LocalDataset(local=str(tmp_path / "eval" / "32"))
    held_images = [np.asarray(held[i]["image"]) for i in range(12)]
    assert all(np.array_equal(held_images[i], _pixels(make_sample(9, "eval", i, (32,)), 32)) for i in (0, 11))
    train_images = {np.asarray(ds[i]["image"]).tobytes() for i in range(24)}
    assert not train_images.intersection(x.tobytes() for x in held_images)


def test_prompt_sets_are_the_held_out_captions():
    """The shapes prompts are the captions the held-out split is written with, by the generator itself."""
    for seed in (0, 3):
        samples = [make_sample(seed, "eval", i, (16,)) for i in range(40)]
        want = [(s["caption"], "two groups" if s["meta"]["relation"] else "one group") for s in samples]
        assert shapes_prompts(40, seed) == want
    assert shapes_prompts(40, 0) != shapes_prompts(40, 3)


def test_every_written_caption_is_the_grammars_phrasing():
    """Writing and parsing are one definition: the words a caption is made of are the ones the parser reads."""
    from models.shapes.grammar import captions_for, GROUP_SLOTS

    scene = {"groups": [{"count": 2, "size": "large", "color": "white", "shape": "triangle"},
                        {"count": 1, "size": "small", "color": "red", "shape": "circle"}], "relation": "left of"}
    assert captions_for(scene, with_size=True) == ["two large white triangles left of a small red circle",
                                                  "a small red circle right of two large white triangles"]
    assert captions_for(scene, with_size=False)[0] == "two white triangles left of a red circle"
    words = {w for _, table, _ in GROUP_SLOTS for w in table.values()}
    assert {"a", "two", "three", "small", "large", *PALETTE, *ALL_SHAPES} == words


def test_captions_parse_back_to_the_stored_scene():
    """Every phrasing the dataset writes (both orders, with and without size) parses to its canonical scene."""
    seen_relations = set()
    for i in range(400):
        meta = make_sample(11, "eval", i, (16,))["meta"]
        truth = scene_from_meta(meta)
        for caption in meta["captions"]:
            scene = parse_caption(caption)
            assert scene is not None, caption
            assert scene.layout == truth.layout
            for got, want in zip(scene.groups, truth.groups, strict=True):
                assert (got.color, got.shape, got.count) == (want.color, want.shape, want.count), caption
                assert got.size == (want.size if meta["with_size"] else None)
            seen_relations |= {w for w in ("above", "below", "left of", "right of") if f" {w} " in caption}
    assert seen_relations == {"above", "below", "left of", "right of"}  # all four directions were exercised
    for text in ("a photo of a cat", "two red circles beside a blue square", "", "a red circle above"):
        assert parse_caption(text) is None


def test_vae_foreground_mask_covers_the_shapes_and_their_edges_only():
    import torch

    from train.shapes.prepare import foreground_mask
    from models.shapes import BACKGROUND, make_sample

    images = [np.asarray(make_sample(4, "train", i, (32,))["images"][32], dtype=np.float32) for i in range(8)]
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2) / 127.5 - 1
    mask = foreground_mask(x)[:, 0]
    off_background = (np.abs(np.stack(images) - np.array(BACKGROUND)).max(axis=-1) > 8)  # drawn pixels
    assert mask.shape == (8, 32, 32)
    assert bool(mask[torch.from_numpy(off_background)].min() == 1)  # every drawn pixel is foreground
    assert 0.02 < float(mask.mean()) < 0.6  # and the flat background mostly is not
    # edges: grown by one pixel around what is drawn, nothing further
    grown = torch.nn.functional.max_pool2d(torch.from_numpy(off_background).float()[:, None], 5, 1, 2)[:, 0]
    assert bool((mask <= grown).all())
