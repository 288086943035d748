"""Sharded Composer checkpoints (``fsdp_state_dict_type: sharded``), read as plain data and consolidated.

A sharded checkpoint is a folder ``ep{epoch}-ba{batch}/`` that torch.distributed.checkpoint (DCP) wrote: one
``__{rank}_0.distcp`` per saving rank and a ``.metadata`` index, which DCP writes last, once every rank's part is
whole. PyTorch 2.7 reads that index with a bare ``pickle.load`` and the non-tensor values (timestamps, the model
spec, callbacks' state) with ``torch.load(weights_only=False)``: a folder crafted to run code would run it.
Here nothing is read that way:

- the index by ``sharded_index.load_index``, which builds records of its own and nothing else: no opcode of the
  file reaches an object of the process (pickle's BUILD set attributes of any class the index named: a 138-byte
  index rewrote ``pathlib``'s containment and link checks for the whole process), and what it builds is held to
  ``INDEX_OBJECTS_PER_BYTE`` times the index's byte limit;
- each value's slice bounded before it is read (a tensor by its declared shape and dtype, anything else by
  ``_value_bound``: its pickle held to ``MAX_VALUE_BYTES``, its tensors to the model's, whatever the part's size),
  its zip checked (``ziphead.stored_zip_problem``: every member
  stored, within the slice, not overlapping: a deflated ``data.pkl`` of 3 MiB inflated to 3 GiB), then loaded with
  ``torch.load(weights_only=True)``;
- a part only by a plain file name in the folder (``__0_0.distcp``, no separator, no link), at an offset and
  length inside that file; the tensors the index declares must fit in the bytes the parts hold before any is
  allocated.

``load_sharded_state(folder)`` gives the ``state`` dict a full checkpoint's file holds (the model's weights
whole), so every reader opens either kind.
"""
from __future__ import annotations

import io
import math
import re
from pathlib import Path

import torch

from ..errors import CheckpointError, first_line
from .plain import SAFE_TYPES
from .sharded_index import Index, IndexTooLarge, TensorEntry, load_index
from .ziphead import mib_limit, stored_zip_problem

METADATA = ".metadata"
PART_NAME = re.compile(r"^__\d+_\d+\.distcp$")
MAX_INDEX_ENV = "DWB_MAX_SHARDED_INDEX_MB"
# The index of a tiny run (1,577 entries, 2 ranks) is 0.85 MiB; it grows with the number of weights and of
# ranks (a chunk per weight per rank): an SDXL-class UNet with AdamW and EMA on 128 ranks is about 100 MiB.
DEFAULT_MAX_INDEX_MB = 256

# What reading an index may build, in bytes per byte of the index limit: 2 GiB at the default. Measured
# (``sharded_index`` counts what each opcode adds), an index builds 10.5 to 15.6 bytes per byte of file: the tiny
# run's, saved by one process (0.44 MiB), 10.5; 3.1 MiB of 12,002 entries 12.2; 107 MiB of 768,050 (6,000 weights in
# 128 chunks each, as 128 ranks save them) 15.6, 1.6 GiB counted and 1.3 GiB of memory. So an index of up to about
# 130 MiB reads under the defaults (a larger run raises DWB_MAX_SHARDED_INDEX_MB, and the budget with it), while an
# index of 240 MiB, under the byte limit, had built 34M objects past 3 GiB.
INDEX_OBJECTS_PER_BYTE = 8
# A value that is no tensor (a spec entry, a timestamp, a callback's state) is a ``torch.save`` zip of plain data:
# in a tiny run's sharded save, 1,261 to 5,229 bytes (numpy's RNG state); the checkpoint saver's list of saved
# checkpoints grows about 300 bytes a checkpoint. Its pickle is held to this; its tensors, if any, to the model's:
# the EMA is one such value (``state.algorithms``: the denoiser's weights whole, 4.4 MB for the tiny UNet, 10 GB
# for an SDXL-class one), so a value may hold tensors up to the model's declared bytes (``_value_bound``).
MAX_VALUE_BYTES = 16 << 20
MODEL_PREFIX = "state.model."  # the model's weights in a Composer checkpoint's index
# A tensor's zip holds its bytes and, measured, 1,545 to 1,577 bytes more (its pickle, version records, 64-byte
# alignment), whatever its size.
TENSOR_ZIP_BYTES = 64 << 10


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


def read_index(folder: Path) -> Index:
    """The folder's DCP index, read by ``sharded_index.load_index`` within ``max_index_bytes()`` and
    ``INDEX_OBJECTS_PER_BYTE`` times that of objects."""
    index = folder / METADATA
    if index.is_symlink() or not index.is_file():
        raise CheckpointError(f"{folder} is not a whole sharded checkpoint ({METADATA} missing)")
    size, limit = index.stat().st_size, max_index_bytes()
    if size > limit:
        raise CheckpointError(f"{folder}: its {METADATA} is {size / 2**20:.1f} MiB, more than {MAX_INDEX_ENV}="
                              f"{limit >> 20} allows")
    try:
        with open(index, "rb") as f:
            data = f.read(size + 1)
        if len(data) > size:
            raise ValueError(f"{METADATA} grew while it was read")
        meta = load_index(data, INDEX_OBJECTS_PER_BYTE * limit)
    except IndexTooLarge as e:
        raise CheckpointError(f"cannot read sharded checkpoint {folder}: its {METADATA} {e} ({INDEX_OBJECTS_PER_BYTE} "
                              f"x {MAX_INDEX_ENV}={limit >> 20} allows)") from None
    except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
        raise CheckpointError(f"cannot read sharded checkpoint {folder}: {first_line(e)}") from None
    if type(meta) is not Index or type(meta.storage_data) is not dict or type(meta.state_dict_metadata) is not dict:
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


def _tensor_bytes(md: TensorEntry) -> int:
    return math.prod(md.size) * md.properties.dtype.itemsize


def _value_bound(tensors: dict) -> int:
    """What a value other than a tensor may take: its pickle, and tensors no larger than the model's (an EMA copy
    of its weights), each with its zip's records."""
    model = sum(_tensor_bytes(md) for fqn, md in tensors.items() if fqn.startswith(MODEL_PREFIX))
    count = sum(1 for fqn in tensors if fqn.startswith(MODEL_PREFIX))
    return MAX_VALUE_BYTES + model + count * TENSOR_ZIP_BYTES


def _check_layout(folder: Path, meta: Index, sizes: dict[str, int]) -> None:
    """Every value inside its part and no longer than it may be (a tensor its declared bytes and
    ``TENSOR_ZIP_BYTES``, anything else ``_value_bound``), and the tensors declared no larger than the parts'
    bytes in all: checked before anything is read or allocated."""
    tensors = {fqn: md for fqn, md in meta.state_dict_metadata.items() if isinstance(md, TensorEntry)}
    if any(int(d) < 0 for md in tensors.values() for d in md.size):  # a negative size would hide a huge one in a sum
        raise CheckpointError(f"sharded checkpoint {folder}: its index declares a tensor of negative size")
    value_bound = _value_bound(tensors)
    for index, info in meta.storage_data.items():
        offset, length = int(info.offset), int(info.length)
        if offset < 0 or length < 0 or offset + length > sizes[info.relative_path]:
            raise CheckpointError(f"sharded checkpoint {folder}: {index.fqn} lies past the end of "
                                  f"{info.relative_path} (cut short?)")
        md = tensors.get(index.fqn)
        bound = value_bound if md is None else _tensor_bytes(md) + TENSOR_ZIP_BYTES
        if length > bound:
            what = "a value other than a tensor" if md is None else "its declared shape and dtype"
            raise CheckpointError(f"sharded checkpoint {folder}: {index.fqn} is stored as {length:,} bytes, more "
                                  f"than {what} may take ({bound:,})")
    declared = sum(_tensor_bytes(md) for md in tensors.values())
    if declared > sum(sizes.values()):
        raise CheckpointError(f"sharded checkpoint {folder}: its index declares {declared:,} bytes of tensors, more "
                              f"than its parts hold ({sum(sizes.values()):,})")


def _read_slice(folder: Path, info) -> bytes:
    with open(folder / info.relative_path, "rb") as f:
        f.seek(int(info.offset))
        return f.read(int(info.length))


def _load_value(raw: bytes):
    """One stored value as plain data, its zip checked first (``ziphead.stored_zip_problem``): a compressed or
    overlapping member would make PyTorch's reader allocate what it declares."""
    if problem := stored_zip_problem(raw, max_pickle=MAX_VALUE_BYTES):
        raise ValueError(problem)
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
    meta = read_index(folder)
    _check_layout(folder, meta, _part_sizes(folder, meta))
    stored = _storage_by_name(meta)
    tree: dict = {}
    paths = meta.planner_data if isinstance(meta.planner_data, dict) else {}
    for fqn, md in meta.state_dict_metadata.items():
        path = _tree_path(paths.get(fqn, tuple(fqn.split("."))))
        if not _wanted(path, skip):
            continue
        try:
            if isinstance(md, TensorEntry):
                value = _consolidate(folder, stored.get(fqn, []), md) if tensors else _Shape(md.size)
            else:
                value = _load_value(_read_slice(folder, _only_storage(stored, fqn)))
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


def _tree_path(path) -> tuple:
    """Where a value goes in the state tree (DCP's ``planner_data``): names and list positions, whose hashes a file
    cannot choose (an int is its own hash: keys all alike would make every insertion walk all the others)."""
    if type(path) is not tuple or not path or not all(
            type(key) is str or type(key) is int and 0 <= key < 1 << 31 for key in path):
        raise ValueError("a value's place in the state is not a tuple of names and list positions")
    return path


def _storage_by_name(meta: Index) -> dict[str, list]:
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
        chunk = _load_value(_read_slice(folder, info))
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
    folder = Path(folder)
    try:
        meta = read_index(folder)
        _check_layout(folder, meta, _part_sizes(folder, meta))
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - DCP's record types with fields of the wrong kind
        return f"cannot read sharded checkpoint {folder}: its index is malformed ({type(e).__name__})"
    for index, info in meta.storage_data.items():
        try:
            _load_value(_read_slice(folder, info))
        except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
            return (f"cannot read sharded checkpoint {folder}: {index.fqn} is corrupt or holds more than plain "
                    f"data ({first_line(e)})")
    return None
