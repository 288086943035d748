"""The shapes domain's datasets and tiny parts (the domain itself: ``models.shapes``).

- ``dataset``: the MDS dataset of ``models.shapes``' samples (with wide and tall scenes: drawn as a source folder and
  converted into aspect-ratio buckets), and its held-out prompt sets;
- ``prepare``: the tiny architecture's frozen parts (tokenizer, text encoder, VAE) fitted on a shapes dataset.
"""
from models.common import face

__getattr__, __all__ = face(__name__, {
    "dataset": "write_shapes_dataset",
    "prepare": "fit_tokenizer prepare_tiny",
})
