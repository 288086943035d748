"""The shapes domain: captioned images of coloured shapes, deterministic by seed, and what reads them back. Every
command that works offline stands on it: training's datasets, evaluate's attribute accuracy and domain FID, the demo.

A scene is one or two groups of identical shapes ("two small red circles above a blue square"). Modules:

- ``scenes``: what a scene holds, how one is drawn at random, laid out (in a square, wide or tall frame) and
  rendered;
- ``grammar``: the captions, written from a scene and parsed back to its attributes from one definition;
- ``samples``: one sample (scene, caption, images) as a pure function of (seed, split, index), and the prompt sets of
  held-out captions drawn by the same function;
- ``scorer``: the small CNN that reads a scene's attributes back from an image, and its training on a shapes
  dataset.

The datasets written from these samples and the tiny frozen parts fitted on them are training's (``train/shapes``).
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "grammar": "ATTRIBUTES COUNTS KINDS RELATIONS Scene asked_attributes captions_for describe_group kinds_of "
               "parse_caption",
    "samples": "SPLITS framed_prompts make_sample sample_meta shapes_prompts",
    "scenes": "ALL_SHAPES BACKGROUND COLORS FRAMES NEW_COLORS NEW_SHAPES PALETTE SHAPES SIZES SUPERSAMPLE frame_size "
              "layout regions render sample_scene",
    "scorer": "ShapesScorer letterbox read_scenes teach_new_concepts train_scorer",
})
