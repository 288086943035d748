"""train: Composer two-phase SD2 training on MosaicML Streaming data, and the checkpoint format.

``load_pipeline(path)`` is the one way into any checkpoint (a Composer ``.pt`` or a diffusers folder).
"""
from .errors import WorkbenchError
from .pipeline import export_pipeline, load_pipeline

__all__ = ["WorkbenchError", "load_pipeline", "export_pipeline"]
