"""The X/Y/Z plot without Gradio: axes and their messages, the order cells are made in, equality with single
generations, and the labelled grid."""
import numpy as np
import pytest
from PIL import Image

from app.generate import GenerationParams, Limits
from app.labelled_grid import MIN_CELL, labelled_grid
from app.service import Service
from app.xyz import Axis, parse_axis, plan
from models.errors import WorkbenchError
from models.generation.images import Settings, generate_images
from models.generation.png import parse_parameters

LIMITS = Limits(max_steps=150, max_size=1024, max_batch=8, max_cells=24)
BA2, BA4 = "tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt"


def base(**kw) -> GenerationParams:
    return GenerationParams(**{**dict(prompt="two blue squares", sampler="Euler a", steps=3, guidance=5.0, width=16,
                                      height=16, seed=7), **kw})


def axes(*pairs) -> tuple[Axis, Axis, Axis]:
    pairs = list(pairs) + [("none", "")] * (3 - len(pairs))
    return tuple(parse_axis(f"{n} axis", kind, values, LIMITS) for n, (kind, values) in zip("XYZ", pairs))


@pytest.fixture(scope="module")
def service(tree):
    return Service([tree.root], limits=LIMITS, cache_size=1)


@pytest.mark.parametrize("pairs, message", [
    ([("colour", "red")], "X axis: unknown type 'colour'; choose one of: checkpoint, guidance"),
    ([("guidance", "3, high")], "X axis (guidance): not a number: 'high'"),
    ([("guidance", "31")], "guidance scale must be between 0 and 30, got 31"),
    ([("steps", "0")], "X axis (steps): steps must be between 1 and 150, got 0"),
    ([("seed", "1"), ("sampler", "Euler, Karras 9000")], "unknown sampler 'Karras 9000'"),
    ([("seed", "1, 2"), ("seed", "3")], "two axes take the same setting"),
    ([("seed", " \n ,")], "X axis: give at least one value"),
    ([("seed", ["1", "2"])], "X axis values must be text, got list"),
    ([(["seed"], "1")], "X axis type must be text, got list"),
    ([("seed", "1,2,3,4,5"), ("guidance", "1,2,3,4,5")], "the plot has 25 cells; at most 24 are allowed"),
    ([("prompt", "a red circle\n" + "x" * 2001)], "X axis (prompt): prompt is 2,001 characters long"),
])
def test_bad_axes_get_a_one_line_message(pairs, message):
    with pytest.raises(WorkbenchError) as e:
        plan(BA4, "ema", base(), axes(*pairs), LIMITS)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_values_labels_and_cells():
    made = plan(BA4, "ema", base(prompt=""), axes(("prompt", "a red circle\ntwo blue squares, left"),
                                                   ("guidance", "3, 7.5"), ("checkpoint", f"{BA2}\n{BA4} (raw)")),
                LIMITS)
    x, y, z = made.axes
    assert x.values == ("a red circle", "two blue squares, left")  # prompts are lines: commas stay in them
    assert y.labels == ("CFG 3", "CFG 7.5") and z.labels == (BA2, f"{BA4} (raw)")
    assert len(made.cells) == 8 and [c.position for c in made.cells[:3]] == [(0, 0, 0), (1, 0, 0), (0, 1, 0)]
    last = made.cells[-1]
    assert (last.checkpoint, last.weights, last.params.prompt, last.params.guidance) == (
        BA4, "raw", "two blue squares, left", 7.5)
    assert {c.params.seed for c in made.cells} == {7} and {c.params.batch_size for c in made.cells} == {1}


def test_checkpoint_is_the_outer_loop_and_cells_sharing_settings_share_a_call():
    # checkpoint on X (the inner axis of the plot), so plot order alternates checkpoints
    made = plan(BA4, "ema", base(), axes(("checkpoint", f"{BA2}\n{BA4}\n{BA2} (raw)"), ("seed", "1, 2, 3"),
                                         ("steps", "2, 3")), LIMITS)
    calls = made.batches(4)
    order = [(call[0].checkpoint, call[0].weights) for call in calls]
    assert order == [(BA2, "ema")] * 2 + [(BA4, "ema")] * 2 + [(BA2, "raw")] * 2  # each loaded once
    for call in calls:
        assert len(call) == 3 and len({c.call_key() for c in call}) == 1  # one pipeline call's settings
    assert sorted(c.position for call in calls for c in call) == sorted(c.position for c in made.cells)
    assert [len(call) for call in made.batches(2)] == [2, 1] * 6


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_cells_equal_single_generations(service, tree):
    """2 checkpoints x 2 seeds x 2 prompts. One cell per call: each equals the single generation bit for bit.
    Batched: each equals the same batch through models.generation bit for bit, and the single generation up
    to float rounding in batched kernels."""
    pairs = (("seed", "11, 12"), ("checkpoint", f"{BA2}\n{BA4}"), ("prompt", "a red circle\ntwo blue squares"))
    args = (BA4, "ema", base(prompt=""), list(pairs))
    alone = service.xyz_plot(*args, batch_size=1)
    batched = service.xyz_plot(*args, batch_size=8)
    assert service.cache.stats.loads == 4  # a cache of one: each checkpoint loaded once per plot
    worst = 0
    for cell, image, record, caption in zip(range(8), alone.cells.images, alone.cells.records, alone.captions):
        single = service.generate(record.checkpoint, "ema", base(prompt=record.prompt, seed=record.seed))
        assert np.array_equal(pixels(image), pixels(single.images[0])), caption
        assert image.info["parameters"] == single.records[0].parameters()  # the cell's PNG says how it was made
        worst = max(worst, np.abs(pixels(batched.cells.images[cell]) - pixels(image)).max())
    assert worst <= 1
    pipe = service.pipeline(service.open(BA2), "ema")  # BA2's four cells were one call of the batched plot
    mine = [i for i, r in enumerate(batched.cells.records) if r.checkpoint == BA2]
    same = generate_images(pipe, [batched.cells.records[i].prompt for i in mine],
                           [batched.cells.records[i].seed for i in mine],
                           Settings(steps=3, guidance=5.0, width=16, height=16, sampler="Euler a"))
    assert all(np.array_equal(pixels(batched.cells.images[i]), same[k]) for k, i in enumerate(mine))
    assert batched.captions[0] == f"seed 11 | {BA2} | a red circle"
    assert len(batched.grids) == 2  # one per prompt (Z)
    p = parse_parameters(batched.cells.images[5].info["parameters"])
    assert (p["Seed"], p["Model"], p["prompt"]) == ("12", BA2, "two blue squares")


def test_grid_labels_rows_and_columns_around_enlarged_cells():
    rng = np.random.default_rng(0)
    cells = [[Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)) for _ in range(3)] for _ in range(2)]
    grid = np.asarray(labelled_grid(cells, ["CFG 3", "CFG 5", "CFG 7"], ["seed 1", "seed 2"], "DPM++ 2M"))
    scale = MIN_CELL // 16  # the short side enlarged to MIN_CELL, pixel for pixel
    ch, cw = 16 * scale, 24 * scale
    height, width = grid.shape[:2]
    row_w, top = width - 3 * cw, height - 2 * ch
    assert row_w > 0 and top > 0  # room for row labels on the left and the title and column labels above
    for i in range(2):
        for j in range(3):
            tile = grid[top + i * ch: top + (i + 1) * ch, row_w + j * cw: row_w + (j + 1) * cw]
            assert np.array_equal(tile, np.asarray(cells[i][j].resize((cw, ch), Image.Resampling.NEAREST)))
    assert (grid[:top, row_w:] < 128).any() and (grid[top:, :row_w] < 128).any()  # text drawn in both margins
    bare = labelled_grid(cells, ["", "", ""], ["", ""])
    assert bare.size == (3 * cw, 2 * ch)  # no axis, no margin


def test_a_prompt_set_is_named_never_a_path(service):
    """The X/Y/Z tab's prompt set: a shipped set by name fills the first free axis, cut to the cell limit; any
    other value, a server path included, is one message and reads nothing."""
    import gradio as gr

    from app.handlers import Handlers
    from models.generation.prompts import read_prompt_table

    handlers = Handlers(service)
    *types, x, y, z = handlers.prompt_set("parti", "seed", "guidance", "none")
    assert [t["value"] for t in types] == ["seed", "guidance", "prompt"] and "value" not in x and "value" not in y
    assert z["value"].split("\n") == [p.text for p in read_prompt_table("parti")][:service.limits.max_cells]
    for name in ("/etc/hostname", "../prompt_sets/drawbench.csv", "drawbench.csv"):
        with pytest.raises(gr.Error, match="unknown prompt set .*: choose one of drawbench, parti"):
            handlers.prompt_set(name, "seed", "guidance", "none")
