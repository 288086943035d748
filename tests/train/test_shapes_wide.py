"""Wide and tall shapes scenes: each caption says what its frame shows, `dwb data convert --aspect-buckets` puts
them whole into wide and tall buckets, and the shapes scorer reads their layout."""
import numpy as np
import pytest
import torch
from streaming import LocalDataset

from models.generation import aspect_bucket, read_prompt_table
from models.shapes import COLORS, frame_size, framed_prompts, FRAMES, make_sample, regions
from train.shapes import write_shapes_dataset
from train.shapes.dataset import BUCKET_STEP, SOURCE_SCALE
from models.shapes.samples import sample_meta
from models.shapes.grammar import parse_caption, scene_from_meta
from models.shapes.scorer import letterbox

BUCKETS_32 = {"wide": (40, 24), "tall": (24, 40), "square": (32, 32)}  # 5:3 whole in a 32 px budget on a step of 8


def _colour_pixels(image, colour) -> np.ndarray:
    """(y, x) of the pixels within 30 (summed over channels) of ``colour``: a shape's inside, not its blended edge."""
    rgb = np.asarray(image, dtype=int)
    return np.argwhere(np.abs(rgb - np.array(colour)).sum(axis=2) < 30)


def test_a_frame_draws_the_scene_its_caption_says_each_group_in_its_region():
    frames = set()
    for i in range(120):
        _, square = sample_meta(3, "train", i)
        sample = make_sample(3, "train", i, (48,), wide=1.0)
        meta, image = sample["meta"], sample["images"][48]
        frame = meta["frame"]
        frames.add(frame)
        # The same scene as in a square dataset, in the frame its relation takes: side by side wide, stacked tall.
        assert (meta["groups"], meta["relation"]) == (square["groups"], square["relation"])
        assert frame == {"left of": "wide", "above": "tall"}.get(meta["relation"], frame)
        assert image.size == frame_size(frame, 48) == {"wide": (80, 48), "tall": (48, 80)}[frame]
        # The caption asks for this scene: its groups, in the order the regions place them.
        asked, drawn = parse_caption(sample["caption"]), scene_from_meta(meta)
        assert asked.layout == drawn.layout
        assert [(g.color, g.shape, g.count) for g in asked.groups] == [(g.color, g.shape, g.count) for g in drawn.groups]
        parts = regions(meta["relation"], frame)
        for group, boxes, (x0, y0, x1, y1) in zip(meta["groups"], meta["boxes"], parts):
            assert len(boxes) == group["count"]
            assert all(x0 - 1e-9 <= b[0] and b[2] <= x1 + 1e-9 and y0 - 1e-9 <= b[1] and b[3] <= y1 + 1e-9 for b in boxes)
        colours = [g["color"] for g in meta["groups"]]
        if len(set(colours)) < len(colours):
            continue  # two groups of one colour: the pixels cannot tell them apart
        for colour, (x0, y0, x1, y1) in zip(colours, parts):  # what is drawn: each group's colour only in its region
            pixels = _colour_pixels(image, COLORS[colour])
            assert len(pixels) > 0
            assert (pixels[:, 1] >= x0 * image.width - 1).all() and (pixels[:, 1] <= x1 * image.width).all()
            assert (pixels[:, 0] >= y0 * image.height - 1).all() and (pixels[:, 0] <= y1 * image.height).all()
    assert frames == {"wide", "tall"}


def test_conversion_puts_each_frame_whole_into_its_bucket_and_the_prompts_carry_it(tmp_path):
    write_shapes_dataset(tmp_path, 40, seed=6, sizes=(32,), n_eval=12, wide=0.75, workers=1, progress=False)
    seen = set()
    for split, folder, count in (("train", tmp_path / "32", 40), ("eval", tmp_path / "eval" / "32", 12)):
        ds = LocalDataset(local=str(folder))
        assert len(ds) == count
        for k in range(count):
            got = ds[k]
            index = int(got["meta"]["source"].split(".")[0])  # the converter keeps each sample's source file
            want = make_sample(6, split, index, (SOURCE_SCALE * 32,), wide=0.75)
            frame = want["meta"].get("frame", "square")
            seen.add(frame)
            assert got["caption"] == want["caption"] and got["meta"]["frame"] == frame
            assert scene_from_meta(got["meta"]) == scene_from_meta(want["meta"])  # the scene, sizes too
            assert got["image"].size == (got["bucket_width"], got["bucket_height"]) == BUCKETS_32[frame]
            assert (got["original_width"], got["original_height"]) == frame_size(frame, SOURCE_SCALE * 32)
            assert got["crop_top"] == got["crop_left"] == 0  # nothing cut off: the frame is its bucket's aspect
    assert seen == {"wide", "tall", "square"}
    # The held-out prompts with each frame's aspect: evaluate draws each at the bucket its scene was stored in.
    prompts = read_prompt_table(tmp_path / "eval" / "prompts.csv", aspect_column="aspect")
    framed = framed_prompts(12, 6, 0.75)
    assert [(p.text, p.category) for p in prompts] == [(caption, category) for caption, category, _ in framed]
    for p, (_, _, frame) in zip(prompts, framed):
        assert p.aspect == FRAMES[frame] and aspect_bucket(p.aspect, 32, BUCKET_STEP) == BUCKETS_32[frame]


def test_letterbox_centres_a_wide_image_on_its_own_background():
    image = torch.full((1, 3, 24, 40), 0.2)
    image[..., 5:9, 30:36] = 0.9  # a shape in the right third
    boxed = letterbox(image)
    assert boxed.shape == (1, 3, 40, 40)
    assert torch.equal(boxed[..., 8:32, :], image)  # the image itself, whole, centred
    assert (boxed[..., :8, :] == 0.2).all() and (boxed[..., 32:, :] == 0.2).all()  # bands of its background
    assert torch.equal(letterbox(image[..., :24, :24]), image[..., :24, :24])  # a square one is left as it is


@pytest.mark.slow  # ~20 s of one core: 2,240 scenes drawn and converted (12 s), a scorer of 93 steps (8 s)
def test_the_scorer_reads_left_of_and_above_in_wide_and_tall_images(tmp_path):
    from evaluate.attribute_accuracy import judge
    from models.shapes import ShapesScorer, train_scorer

    write_shapes_dataset(tmp_path, 2000, seed=5, sizes=(32,), n_eval=240, wide=0.75, workers=1, progress=False)
    info = train_scorer(tmp_path, tmp_path / "scorer.pt", epochs=3, batch_size=64, lr=6e-3, seed=1, progress=False)
    assert info["n_held_out_non_square"] > 150 and info["held_out_non_square"]["layout"] >= 0.7
    scorer = ShapesScorer(tmp_path / "scorer.pt")
    held = LocalDataset(local=str(tmp_path / "eval" / "32"))
    right = {"wide": [], "tall": []}
    for k in range(len(held)):
        sample = held[k]
        asked = parse_caption(sample["caption"])
        if sample["meta"]["frame"] == "square" or asked.layout == "one group":
            continue
        image = torch.from_numpy(np.array(sample["image"].convert("RGB"))).permute(2, 0, 1)[None]  # as drawn: 40x24
        right[sample["meta"]["frame"]].append(judge(asked, scorer.predict(image)[0])["position"])
    # "A left of B" in a wide image (and "A above B" in a tall one): both groups found, on that axis, in that order.
    # Measured: 0.76 of 54 wide, 0.87 of 38 tall (the frame alone gives the axis, and so 0.5 with a random order).
    assert min(map(len, right.values())) >= 30
    assert np.mean(right["wide"] + right["tall"]) >= 0.7, right
    assert {frame: np.mean(v) >= 0.65 for frame, v in right.items()} == {"wide": True, "tall": True}, right
