"""The shapes domain: captioned images of coloured shapes, deterministic by seed, and what reads them back.

A scene is one or two groups of identical shapes ("two small red circles above a blue square"). Rooms:

- ``scenes``: what a scene holds, how one is drawn at random, laid out (in a square, wide or tall frame) and
  rendered;
- ``grammar``: the captions, written from a scene and parsed back to its attributes from one definition;
- ``dataset``: one sample (scene, caption, images) as a pure function of (seed, split, index), the MDS dataset
  (with wide and tall scenes: drawn as a source folder and converted into aspect-ratio buckets);
- ``prompts``: prompt sets of held-out captions, from the dataset's own sampling function;
- ``scorer``: the small CNN that reads a scene's attributes back from an image;
- ``prepare``: the tiny architecture's frozen parts (tokenizer, text encoder, VAE) fitted on a shapes dataset.
"""
from models.common import face

__getattr__, __all__ = face(__name__, {
    "dataset": "SPLITS framed_prompts make_sample sample_meta write_shapes_dataset",
    "grammar": "ATTRIBUTES COUNTS KINDS RELATIONS Scene asked_attributes captions_for describe_group kinds_of "
               "parse_caption",
    "prepare": "fit_tokenizer prepare_tiny",
    "prompts": "shapes_prompts",
    "scenes": "BACKGROUND COLORS FRAMES SHAPES SIZES SUPERSAMPLE frame_size layout regions render sample_scene",
    "scorer": "ShapesScorer letterbox read_scenes train_scorer",
})
