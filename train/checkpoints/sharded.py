"""Sharded Composer checkpoints (``fsdp_state_dict_type: sharded``), read as plain data and consolidated.

A sharded checkpoint is a folder ``ep{epoch}-ba{batch}/`` that torch.distributed.checkpoint (DCP) wrote: one
``__{rank}_0.distcp`` per saving rank and a ``.metadata`` index, which DCP writes last, once every rank's part is
whole. PyTorch 2.7 reads that index with a bare ``pickle.load`` and the non-tensor values (timestamps, the model
spec, callbacks' state) with ``torch.load(weights_only=False)``: a folder crafted to run code would run it.
Here nothing is read that way:

- the index through ``_IndexUnpickler``, which builds only DCP's own record classes, ``torch.Size``, dtypes,
  layouts and paths; any other global refuses the folder;
- each value with ``torch.load(weights_only=True)``, tensors from a slice whose zip is checked first (stored
  members no larger than the slice), so a declared size cannot make it allocate more than the file holds;
- a part only by a plain file name in the folder (``__0_0.distcp``, no separator, no link), at an offset and
  length inside that file; the tensors the index declares must fit in the bytes the parts hold before any is
  allocated.

``load_sharded_state(folder)`` gives the ``state`` dict a full checkpoint's file holds (the model's weights
whole), so every reader opens either kind.
"""
from __future__ import annotations

import io
import pickle
import re
import zipfile
from pathlib import Path

import torch

from ..errors import CheckpointError, first_line
from .plain import SAFE_TYPES
from .ziphead import mib_limit

METADATA = ".metadata"
PART_NAME = re.compile(r"^__\d+_\d+\.distcp$")
MAX_INDEX_ENV = "DWB_MAX_SHARDED_INDEX_MB"
# The index of a tiny run (1,577 entries, 2 ranks) is 0.85 MiB; it grows with the number of weights and of
# ranks (a chunk per weight per rank): an SDXL-class UNet with AdamW and EMA on 128 ranks is about 100 MiB.
DEFAULT_MAX_INDEX_MB = 256

_INDEX_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                              "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


def is_sharded_folder(path: str | Path) -> bool:
    """A folder DCP finished writing (its index is written last)."""
    path = Path(path)
    return path.is_dir() and (path / METADATA).is_file()


def max_index_bytes() -> int:
    """Bytes a sharded checkpoint's index may have (``DWB_MAX_SHARDED_INDEX_MB``)."""
    return mib_limit(MAX_INDEX_ENV, DEFAULT_MAX_INDEX_MB)


class _Shape:
    """A tensor's shape without its bytes, where a listing needs no more."""

    def __init__(self, size):
        self.shape = tuple(size)


class _IndexUnpickler(pickle.Unpickler):
    """DCP's index records and nothing else: a global outside them is refused before it is imported."""

    def find_class(self, module, name):
        if name in _INDEX_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"the index names {module}.{name}, which a checkpoint index does not hold")


def read_index(folder: Path):
    """The folder's DCP ``Metadata``, unpickled with ``_IndexUnpickler`` within ``max_index_bytes()``."""
    from torch.distributed.checkpoint.metadata import Metadata

    index = folder / METADATA
    if index.is_symlink() or not index.is_file():
        raise CheckpointError(f"{folder} is not a whole sharded checkpoint ({METADATA} missing)")
    size, limit = index.stat().st_size, max_index_bytes()
    if size > limit:
        raise CheckpointError(f"{folder}: its {METADATA} is {size / 2**20:.1f} MiB, more than {MAX_INDEX_ENV}="
                              f"{limit >> 20} allows")
    try:
        with open(index, "rb") as f:
            meta = _IndexUnpickler(f).load()
    except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
        raise CheckpointError(f"cannot read sharded checkpoint {folder}: {first_line(e)}") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict):
        raise CheckpointError(f"cannot read sharded checkpoint {folder}: {METADATA} is not a DCP index")
    return meta


def _part_sizes(folder: Path, meta) -> dict[str, int]:
    """Each part the index names, by a plain file name inside the folder, with its size."""
    sizes: dict[str, int] = {}
    for info in meta.storage_data.values():
        name = str(getattr(info, "relative_path", ""))
        if name in sizes:
            continue
        part = folder / name
        if not PART_NAME.match(name) or part.is_symlink() or not part.is_file():
            raise CheckpointError(f"sharded checkpoint {folder}: its index names a part {name!r} that is not a "
                                  "file of the folder")
        sizes[name] = part.stat().st_size
    return sizes


def _check_layout(folder: Path, meta, sizes: dict[str, int]) -> None:
    """Every value inside its part, and the tensors declared no larger than the parts' bytes in all."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for index, info in meta.storage_data.items():
        offset, length = int(info.offset), int(info.length)
        if offset < 0 or length < 0 or offset + length > sizes[info.relative_path]:
            raise CheckpointError(f"sharded checkpoint {folder}: {index.fqn} lies past the end of "
                                  f"{info.relative_path} (cut short?)")
    tensors = [md for md in meta.state_dict_metadata.values() if isinstance(md, TensorStorageMetadata)]
    if any(int(d) < 0 for md in tensors for d in md.size):  # a negative size would hide a huge one in the sum
        raise CheckpointError(f"sharded checkpoint {folder}: its index declares a tensor of negative size")
    declared = sum(md.size.numel() * md.properties.dtype.itemsize for md in tensors)
    if declared > sum(sizes.values()):
        raise CheckpointError(f"sharded checkpoint {folder}: its index declares {declared:,} bytes of tensors, more "
                              f"than its parts hold ({sum(sizes.values()):,})")


def _read_slice(folder: Path, info) -> bytes:
    with open(folder / info.relative_path, "rb") as f:
        f.seek(int(info.offset))
        return f.read(int(info.length))


def _load_value(raw: bytes, tensor: bool):
    """One stored value as plain data; a tensor's zip must hold stored members within the slice."""
    if tensor:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            if any(m.compress_type != zipfile.ZIP_STORED or m.file_size > len(raw) for m in z.infolist()):
                raise ValueError("a tensor's record is compressed or larger than its slice")
            if bad := z.testzip():
                raise ValueError(f"corrupt member {bad}")
    with torch.serialization.safe_globals(SAFE_TYPES):
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def _wanted(path: tuple, skip: tuple[str, ...]) -> bool:
    return not any(".".join(map(str, path)).startswith(prefix) for prefix in skip)


def load_sharded_state(folder: str | Path, skip: tuple[str, ...] = ("state.optimizers",),
                       tensors: bool = True) -> dict:
    """The ``state`` dict of a sharded Composer checkpoint, each tensor consolidated whole, as plain data.

    ``skip``: prefixes of values not read (the optimizer's moments, which no reader of weights needs);
    ``tensors=False`` gives each tensor as a stand-in holding its ``shape`` and reads none of their bytes.
    An index of DCP's record types with fields of the wrong kind is one line too, as any corrupt file."""
    try:
        return _load_sharded_state(Path(folder), skip, tensors)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
        raise CheckpointError(f"cannot read sharded checkpoint {folder}: its index is malformed "
                              f"({type(e).__name__}: {first_line(e)})") from None


def _load_sharded_state(folder: Path, skip: tuple[str, ...], tensors: bool) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = read_index(folder)
    _check_layout(folder, meta, _part_sizes(folder, meta))
    stored = _storage_by_name(meta)
    tree: dict = {}
    paths = meta.planner_data if isinstance(meta.planner_data, dict) else {}
    for fqn, md in meta.state_dict_metadata.items():
        path = tuple(paths.get(fqn, tuple(fqn.split("."))))
        if not _wanted(path, skip):
            continue
        try:
            if isinstance(md, TensorStorageMetadata):
                value = _consolidate(folder, stored.get(fqn, []), md) if tensors else _Shape(md.size)
            else:
                value = _load_value(_read_slice(folder, _only_storage(stored, fqn)), tensor=False)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
            raise CheckpointError(f"cannot read sharded checkpoint {folder}: {fqn} is corrupt or holds more than "
                                  f"plain data ({first_line(e)})") from None
        _put(tree, path, value)
    state = _as_lists(tree).get("state")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{folder} is not a Composer checkpoint (no state.model inside)")
    return state


def _storage_by_name(meta) -> dict[str, list]:
    stored: dict[str, list] = {}
    for index, info in meta.storage_data.items():
        stored.setdefault(index.fqn, []).append((index, info))
    return stored


def _only_storage(stored: dict[str, list], fqn: str):
    found = [info for _, info in stored.get(fqn, [])]
    if len(found) != 1:
        raise CheckpointError(f"sharded checkpoint: {fqn} is stored {len(found)} times")
    return found[0]


def _consolidate(folder: Path, chunks: list, md) -> torch.Tensor:
    """A tensor whole from its chunks, each one read, checked against its declared shape and copied in."""
    whole = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    covered = 0
    for index, info in chunks:
        offsets = tuple(index.offset or ())
        chunk = _load_value(_read_slice(folder, info), tensor=True)
        if not isinstance(chunk, torch.Tensor) or len(offsets) != whole.dim():
            raise ValueError("a chunk that is no tensor of the declared rank")
        view = whole
        for dim, (start, length) in enumerate(zip(offsets, chunk.shape)):
            if start < 0 or start + length > whole.shape[dim]:
                raise ValueError("a chunk outside the tensor")
            view = view.narrow(dim, start, length)
        view.copy_(chunk)
        covered += chunk.numel()
    if covered < whole.numel():
        raise ValueError(f"its chunks cover {covered} of {whole.numel()} values")
    return whole


def _put(tree: dict, path: tuple, value) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise CheckpointError(f"sharded checkpoint: {'.'.join(map(str, path))} is under a value")
    node[path[-1]] = value


def _as_lists(node):
    """DCP flattens lists into integer keys: a dict whose keys are 0..n-1 is a list again."""
    if not isinstance(node, dict):
        return node
    node = {k: _as_lists(v) for k, v in node.items()}
    if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
        return [node[i] for i in range(len(node))]
    return node


def saved_world_size(folder: str | Path) -> int | None:
    """The number of ranks that trained the run when it saved this checkpoint (Composer's metadata)."""
    state = load_sharded_state(folder, skip=("state.optimizers", "state.algorithms", "state.callbacks"),
                               tensors=False)
    size = (state.get("metadata") or {}).get("world_size")
    return int(size) if isinstance(size, int) else None


def sharded_problem(folder: str | Path) -> str | None:
    """Why a sharded checkpoint folder cannot be resumed from (no index, a part cut short or corrupt, a value that
    is more than plain data), or None. Reads every stored value once, optimizer state included, one at a time:
    rank 0 holds one chunk, never the whole state."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(folder)
    try:
        meta = read_index(folder)
        _check_layout(folder, meta, _part_sizes(folder, meta))
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - DCP's record types with fields of the wrong kind
        return f"cannot read sharded checkpoint {folder}: its index is malformed ({type(e).__name__})"
    for index, info in meta.storage_data.items():
        is_tensor = isinstance(meta.state_dict_metadata.get(index.fqn), TensorStorageMetadata)
        try:
            _load_value(_read_slice(folder, info), tensor=is_tensor)
        except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
            return (f"cannot read sharded checkpoint {folder}: {index.fqn} is corrupt or holds more than plain "
                    f"data ({first_line(e)})")
    return None
