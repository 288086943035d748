import numpy as np
import torch
from PIL import Image

from models.checkpoints.components import assemble_pipeline, build_unet, load_frozen_parts
from models.families import family_named
from models.generation import Settings
from models.generation.grid import generate, write_grid


def _pipe(components):
    torch.manual_seed(0)
    vae, text_encoder, tokenizer = load_frozen_parts(str(components))
    parts = {"unet": build_unet("tiny"), "vae": vae, "text_encoder": text_encoder}
    return assemble_pipeline(family_named("sd2"), parts, {"tokenizer": tokenizer}, {"prediction_type": "v_prediction"})


def test_batched_grid_cells_equal_their_own_single_image_call(components):
    pipe = _pipe(components)
    prompts, seeds = ["a red circle", "two blue squares above a green triangle"], [0, 5, 9]
    # five images per pipeline call: the grid's six cells span two calls of different makeup
    grid = generate(pipe, prompts, seeds, Settings(steps=3, guidance=3.0, width=32, height=32), max_batch=5)
    assert grid.shape == (2, 3, 32, 32, 3) and grid.dtype == np.uint8
    for i, prompt in enumerate(prompts):
        for j, seed in enumerate(seeds):
            alone = pipe(prompt, num_inference_steps=3, guidance_scale=3.0, height=32, width=32,
                         generator=torch.Generator().manual_seed(seed), output_type="np").images[0]
            alone = (alone * 255).round().astype(np.uint8)
            assert np.abs(grid[i, j].astype(int) - alone.astype(int)).max() <= 2, (prompt, seed)
    assert np.abs(grid[0, 0].astype(int) - grid[0, 1].astype(int)).mean() > 1  # seeds differ


def test_write_grid_lays_out_prompts_by_seeds(components, tmp_path):
    out = write_grid(_pipe(components), tmp_path / "g" / "grid.png", prompts=["a red circle"] * 3, seeds=(0, 1),
                     title="t", settings=Settings(steps=2, width=16, height=16))
    image = Image.open(out)
    assert image.size == (300 + 2 * 96, 24 + 3 * 96)


def test_large_images_keep_their_size_and_shape_in_the_grid():
    """A full-size model's 256x192 images are laid out pixel for pixel (not squeezed into small square cells)."""
    from models.generation.grid import grid_image

    images = np.random.default_rng(0).integers(0, 256, (2, 3, 192, 256, 3), dtype=np.uint8)
    grid = np.asarray(grid_image(images, ["a", "b"], title="t"))
    assert grid.shape == (24 + 2 * 192, 300 + 3 * 256, 3)
    assert np.array_equal(grid[24 + 192:, 300 + 2 * 256:], images[1, 2])
