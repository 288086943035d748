"""New colours and shapes of the shapes domain (``NEW_COLORS``, ``NEW_SHAPES``): the data never draws them, the
captions and the renderer know them, and a scorer can be taught them without changing how a scorer of the data alone
reads."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from models.errors import WorkbenchError
from models.shapes import ALL_SHAPES, COLORS, NEW_COLORS, NEW_SHAPES, PALETTE, SHAPES, ShapesScorer, make_sample
from models.shapes import parse_caption, read_scenes, render, sample_meta, teach_new_concepts, train_scorer
from models.shapes.grammar import scene_from_meta
from models.shapes.scorer import SCORER_SIZE, ShapesNet, reading_accuracy, write_scorer

NEW = next(iter(NEW_COLORS))
NEW_SHAPE = NEW_SHAPES[0]
CONCEPTS = {"color": (COLORS, NEW_COLORS, PALETTE, NEW), "shape": (SHAPES, NEW_SHAPES, ALL_SHAPES, NEW_SHAPE)}


@pytest.mark.parametrize("attribute", CONCEPTS)
def test_the_data_never_draws_a_new_one_and_a_new_one_s_sample_holds_it_in_one_group(attribute):
    drawn_names, new_names, every, new = CONCEPTS[attribute]
    assert not set(new_names) & set(drawn_names) and list(every) == [*drawn_names, *new_names]
    drawn = {g[attribute] for i in range(300) for g in sample_meta(0, "train", i)[1]["groups"]}
    assert drawn == set(drawn_names)
    for i in range(40):
        caption, meta = sample_meta(0, "train", i, **{f"new_{attribute}": new})
        assert sum(g[attribute] == new for g in meta["groups"]) == 1 and new in caption
        want = scene_from_meta(meta)
        if not meta["with_size"]:
            want = replace(want, groups=tuple(replace(g, size=None) for g in want.groups))
        assert parse_caption(caption) == want  # the grammar writes and reads the new word


def test_a_new_colour_is_rendered_in_its_own_rgb_and_an_unknown_one_is_one_line():
    sample = make_sample(0, "train", 3, (32,), new_color=NEW)
    pixels = np.asarray(sample["images"][32].convert("RGB")).reshape(-1, 3).astype(int)
    assert (np.abs(pixels - np.array(NEW_COLORS[NEW])).max(axis=1) <= 2).sum() >= 10
    with pytest.raises(WorkbenchError, match=r"^'red' is not a new colour of the shapes domain: [^\n]*$"):
        sample_meta(0, "train", 0, new_color="red")
    with pytest.raises(WorkbenchError, match=r"^'circle' is not a new shape of the shapes domain: star[^\n]*$"):
        sample_meta(0, "train", 0, new_shape="circle")


def test_a_new_shape_is_drawn_as_itself_inside_the_box_a_circle_fills():
    """A star of one box covers less than the circle of that box, nothing outside the box, its top point, and not the
    circle's upper left (between two of its points)."""
    def covered(shape: str) -> np.ndarray:
        scene = {"groups": [{"shape": shape, "color": "white", "count": 1, "size": "large"}], "relation": None}
        return np.asarray(render(scene, [[[0.25, 0.25, 0.75, 0.75]]], 64).convert("L")) > 128

    star, circle = covered(NEW_SHAPE), covered("circle")
    assert 0.3 * circle.sum() < star.sum() < 0.7 * circle.sum()
    assert not star[:15].any() and not star[49:].any() and not star[:, :15].any() and not star[:, 49:].any()
    assert star[18:21, 31:33].all() and circle[22, 22] and not star[22, 22]


@pytest.mark.parametrize("attribute", CONCEPTS)
def test_a_head_of_n_classes_reads_the_first_n_colours_or_shapes(attribute):
    """A scorer of the data alone (6 colour, 3 shape classes) reads as it did; a taught one reads the new ones too."""
    drawn_names, _, every, new = CONCEPTS[attribute]

    def logits(width: int, winner: int) -> dict:
        out = {"layout": torch.tensor([[9.0, 0, 0, 0]])}
        for i in range(2):
            out |= {f"color{i}": torch.tensor([[1.0, 0, 0]]), f"shape{i}": torch.tensor([[1.0, 0, 0]]),
                    f"count{i}": torch.tensor([[1.0, 0, 0]]), f"size{i}": torch.tensor([[1.0, 0]]),
                    f"{attribute}{i}": torch.nn.functional.one_hot(torch.tensor([winner]), width).float()}
        return out

    read = [getattr(read_scenes(logits(len(drawn_names), k))[0].groups[0], attribute) for k in range(len(drawn_names))]
    assert read == list(drawn_names)
    assert getattr(read_scenes(logits(len(every), len(drawn_names)))[0].groups[0], attribute) == new


@pytest.mark.parametrize("key,word,many", [("colors", "colours", len(PALETTE) + 1), ("colors", "colours", "7"),
                                           ("shapes", "shapes", len(ALL_SHAPES) + 1), ("shapes", "shapes", 0)])
def test_a_scorer_file_of_more_colours_or_shapes_than_the_domain_knows_is_one_line(tmp_path, key, word, many):
    write_scorer(ShapesNet(), {"width": 32, "feature_dim": 256, key: many}, tmp_path / "s.pt")
    with pytest.raises(WorkbenchError, match=rf"^\S+s\.pt reads \S+ {word}; the shapes domain knows \d+$"):
        ShapesScorer(tmp_path / "s.pt")


def _tensors(samples):
    images = np.stack([np.asarray(s["images"][SCORER_SIZE].convert("RGB")) for s in samples])
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), [scene_from_meta(s["meta"]) for s in samples]


def test_a_taught_scorer_reads_the_new_colour_and_shape_that_its_untaught_one_cannot(shapes_data, tmp_path):
    """A scorer of 2 epochs on 192 images, then taught 6 epochs on 480: 160 of the data's, 160 holding the new
    colour, 160 the new shape (6.7 s on one thread, loaded)."""
    old = tmp_path / "scorer.pt"
    train_scorer(shapes_data, old, epochs=2, batch_size=64, progress=False)

    def holding(split: str, n: int) -> list:
        return [make_sample(1, split, i, (SCORER_SIZE,), **{f"new_{a}": CONCEPTS[a][3]}) for a in CONCEPTS
                for i in range(n)]

    new, held = _tensors(holding("train", 160)), _tensors(holding("eval", 48))
    info = teach_new_concepts(old, shapes_data, tmp_path / "taught.pt", new, held, base_images=160, epochs=6,
                              batch_size=64, lr=3e-3)
    untaught, taught = ShapesScorer(old), ShapesScorer(tmp_path / "taught.pt")
    assert [taught.net.slots[0][a].out_features for a in CONCEPTS] == [len(PALETTE), len(ALL_SHAPES)]
    assert [untaught.net.slots[0][a].out_features for a in CONCEPTS] == [len(COLORS), len(SHAPES)]

    def new_read(scorer, attribute: str) -> float:  # of the held-out groups holding the new one, the share read so
        new = CONCEPTS[attribute][3]
        pairs = [(g, s) for scene, seen in zip(held[1], scorer.predict(held[0]))
                 for g, s in zip(scene.groups, seen.groups) if getattr(g, attribute) == new]
        return sum(getattr(s, attribute) == new for _, s in pairs) / len(pairs)

    assert [new_read(untaught, a) for a in CONCEPTS] == [0.0, 0.0]
    assert min(new_read(taught, a) for a in CONCEPTS) > 0.5
    assert info["held_out_new"] == {k: round(v, 4) for k, v in reading_accuracy(taught.net, *held).items()}
