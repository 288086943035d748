"""The shapes domain: captioned images of coloured shapes, deterministic by seed, and what reads them back.

A scene is one or two groups of identical shapes ("two small red circles above a blue square"). Rooms:

- ``scenes``: what a scene holds, how one is drawn at random, laid out and rendered;
- ``grammar``: the captions, written from a scene and parsed back to its attributes from one definition;
- ``dataset``: one sample (scene, caption, images) as a pure function of (seed, split, index), the MDS dataset;
- ``prompts``: prompt sets of held-out captions, from the dataset's own sampling function;
- ``scorer``: the small CNN that reads a scene's attributes back from an image (torch; imported on its own).
"""
from .dataset import SPLITS, make_sample, sample_meta, write_shapes_dataset
from .grammar import COUNTS, RELATIONS, captions_for, describe_group, parse_caption
from .scenes import BACKGROUND, COLORS, SHAPES, SIZES, SUPERSAMPLE, layout, render, sample_scene

__all__ = ["BACKGROUND", "COLORS", "COUNTS", "RELATIONS", "SHAPES", "SIZES", "SPLITS", "SUPERSAMPLE", "captions_for",
           "describe_group", "layout", "make_sample", "parse_caption", "render", "sample_meta", "sample_scene",
           "write_shapes_dataset"]
