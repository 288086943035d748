"""train: Composer two-phase SD2 training on MosaicML Streaming data, and the checkpoint format.

``load_pipeline(ref)`` is the one way into any checkpoint (``train.checkpoints``: Composer files, mosaicml/diffusion
checkpoints, diffusers folders, single files, hub ids, s3:// URIs).
"""
from .errors import WorkbenchError

__all__ = ["WorkbenchError", "load_pipeline", "export_pipeline"]


def __getattr__(name: str):
    # Lazy: importing diffusers and torch takes seconds, and `dwb --help` should not wait for them.
    if name in ("load_pipeline", "export_pipeline"):
        from . import checkpoints

        return getattr(checkpoints, name)
    raise AttributeError(f"module 'train' has no attribute {name!r}")
