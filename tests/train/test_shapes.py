import numpy as np
from streaming import StreamingDataset

from train.mds import count_samples
from train.shapes import COLORS, RELATIONS, SHAPES, make_sample, write_shapes_dataset


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


def test_mds_round_trip(tmp_path):
    write_shapes_dataset(tmp_path, 24, seed=9, sizes=(16, 32), n_eval=5, progress=False)
    assert count_samples(tmp_path / "16") == count_samples(tmp_path / "32") == 24
    assert count_samples(tmp_path / "eval" / "32") == 5
    ds = StreamingDataset(local=str(tmp_path / "32"), shuffle=False, batch_size=1)
    for i in (0, 7, 23):
        want = make_sample(9, "train", i, (32,))
        got = ds[i]
        assert got["caption"] == want["caption"] and got["meta"]["groups"] == want["meta"]["groups"]
        assert np.array_equal(np.asarray(got["image"]), _pixels(want, 32))  # PNG is lossless


def test_vae_foreground_mask_covers_the_shapes_and_their_edges_only():
    import torch

    from train.prepare import foreground_mask
    from train.shapes import BACKGROUND, make_sample

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
