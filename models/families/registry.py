"""Every family, and how a checkpoint's family is found: from a diffusers folder's pipeline class, a loaded
pipeline, or a single file's weight names."""
from __future__ import annotations

from pathlib import Path

from ..common import load_outside
from ..errors import CheckpointError, WorkbenchError
from .family import Family
from .flux import FLUX
from .sd3 import SD3
from .sdxl import SDXL
from .stable_diffusion import SD1, SD2

# In the order single files are recognised: a file's most specific marks first (an SD3 file may carry CLIP-L
# weights, an SDXL file an OpenCLIP model, under their own prefixes).
FAMILIES: tuple[Family, ...] = (FLUX, SD3, SDXL, SD2, SD1)
SD1_CROSS_ATTENTION = 768  # SD 1.x's UNet attends to CLIP ViT-L/14's 768-wide states; 2.x's to 1024 (ours: any other)


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise WorkbenchError(f"unknown model family {name!r}; the families are: {', '.join(f.name for f in FAMILIES)}")


def family_or_ours(name: str | None) -> Family:
    """The family a description names, or, where it names none (this workbench's own Composer checkpoints,
    built like SD 2: one CLIP tower, a UNet, the diffusion schedule), SD 2.x's."""
    return family_named(name) if name else SD2


def _by_pipeline_class(cls: str, unet_cross_attention: int | None, where: str) -> Family:
    if cls in SD2.folder_classes:  # SD 1.x's and 2.x's pipelines (text to image, inpainting) are one class each
        return SD1 if unet_cross_attention == SD1_CROSS_ATTENTION else SD2
    for family in FAMILIES:
        if cls in family.folder_classes:
            return family
    names = sorted(c for f in FAMILIES for c in f.folder_classes)
    raise CheckpointError(f"{where}: a {cls} folder; the workbench opens {', '.join(names)}")


def family_of_pipeline(pipe) -> Family:
    unet = getattr(pipe, "unet", None)
    return _by_pipeline_class(type(pipe).__name__, unet.config.cross_attention_dim if unet is not None else None,
                              type(pipe).__name__)


def family_of_folder(folder: Path, where: str) -> Family:
    """The family of a diffusers folder, from its ``model_index.json`` (and SD 1 from 2 by the UNet's config)."""
    try:
        index = load_outside(folder / "model_index.json", "model_index.json")
        cls = index.get("_class_name") if isinstance(index, dict) else None
        cross = None
        if cls in SD2.folder_classes and (folder / "unet" / "config.json").is_file():
            cross = load_outside(folder / "unet" / "config.json", "unet/config.json").get("cross_attention_dim")
    except (WorkbenchError, AttributeError) as e:
        raise CheckpointError(f"{where}: {e}") from None
    if not isinstance(cls, str):
        raise CheckpointError(f"{where}: model_index.json names no pipeline class (_class_name)")
    return _by_pipeline_class(cls, cross, where)


def family_of_keys(keys) -> Family | None:
    """The family a single file's weight names show (``Family.single_file_marks``, with or without the original
    layouts' ``model.diffusion_model.`` prefix), or None where none of the newer families' marks is there."""
    keys = list(keys)
    for family in FAMILIES:
        for mark in family.single_file_marks:
            if any(k.startswith(mark) or k.startswith("model.diffusion_model." + mark) for k in keys):
                return family
    return None
