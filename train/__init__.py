"""train: Composer two-phase SD2 training on MosaicML Streaming data, and the checkpoint format.

``load_pipeline(path)`` is the one way into any checkpoint (a Composer ``.pt`` or a diffusers folder).
"""
from .errors import WorkbenchError

__all__ = ["WorkbenchError", "load_pipeline", "export_pipeline"]


def __getattr__(name: str):
    # Lazy: importing diffusers and torch takes seconds, and `dwb --help` should not wait for them.
    if name in ("load_pipeline", "export_pipeline"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'train' has no attribute {name!r}")
