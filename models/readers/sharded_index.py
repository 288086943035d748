"""A sharded checkpoint's DCP index (``.metadata``), read as records and nothing else.

PyTorch 2.7 writes the index with ``pickle.dump`` and reads it back with a bare ``pickle.load``. An unpickler that
refuses globals (``find_class``) is not enough: pickle's BUILD opcode sets attributes of whatever is on the stack, a
class it was allowed to name included, so a 138-byte index naming ``pathlib.PosixPath`` rewrote ``is_relative_to``
and ``is_symlink`` for the whole process (every containment check of the app then passed, every link check failed).
Python's unpickler cannot be told which objects BUILD may change, so the index is read by a loop of its own over the
opcodes ``pickle.dump`` writes for DCP's records (protocols 2 to 5), in which no opcode reaches an object the read
did not make:

- a global is a name looked up in ``_GLOBALS``, never imported: DCP's record classes stand for this module's
  ``Record`` types, ``torch.Size`` makes a tuple, a path a str, the layout and memory-format encodings their name
  and number; dtypes are the dtypes themselves (no attribute of theirs can be set); no class or function of the
  process is ever on the stack;
- NEWOBJ makes a record; BUILD fills a record this read made and has not filled, with that record's own fields;
  APPEND and SETITEM(S) add only to the lists and dicts the read made, under str or record keys (whose hashes a
  file cannot choose: no crafted collisions);
- what the read builds is counted as it is built, each opcode at the bytes it adds (a reference 8, an empty dict 72,
  a dict's entry 60, a string its size...), items before they are added, and held to a budget besides the file's
  own size (measured, what an index of 1 to 19 MiB of the patterns that build most per byte holds at its refusal is
  within 5% of the budget).

The price is Python's speed, against pickle's C loop with DCP's classes (CPU seconds, one core, a busy machine): a
tiny run's 0.44 MiB index 0.11 s (0.01 s); a real save of 3,000 weights and their AdamW state, 3.1 MiB and 12,002
entries, 1.0 s (0.37 s); 107 MiB of 768,050 entries (6,000 weights in 128 chunks each, as 128 ranks save them)
31 to 44 s (9.3 s), in 1.3 GiB (1.6 GiB), read once per version of the file.
"""
from __future__ import annotations

import gc
import sys
from itertools import islice
from pathlib import PurePosixPath, PureWindowsPath

import torch


class IndexRefused(ValueError):
    """Why an index was refused, as a sentence about "the index" (the caller names its folder)."""


class IndexTooLarge(IndexRefused):
    """An index that builds more than its budget of objects (the caller names the limit that sets it)."""


class Record:
    """One record of the index: its fields are slots, set by one BUILD (None where it left one out); hashed by
    identity, so a file cannot choose the hash of a key."""

    __slots__ = ()
    FIELDS: frozenset[str] = frozenset()

    def __init_subclass__(cls):
        cls.FIELDS = frozenset(cls.__slots__)

    def __getattr__(self, name):  # a field BUILD did not set
        if name in self.FIELDS:
            return None
        raise AttributeError(name)

    def build(self, state) -> None:
        if type(state) is not dict or not state.keys() <= self.FIELDS:
            raise IndexRefused(f"the index fills a {type(self).__name__} record with fields it does not have")
        for name, value in state.items():
            setattr(self, name, value)


class Index(Record):
    __slots__ = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta")


class TensorEntry(Record):
    """A tensor's declared shape and dtype; its size a tuple of ints (no string a product would repeat)."""

    __slots__ = ("properties", "size", "chunks")

    def build(self, state) -> None:
        super().build(state)
        if type(self.size) is not tuple or not all(type(d) is int for d in self.size):
            raise IndexRefused("the index declares a tensor whose size is not a tuple of integers")
        if type(self.properties) is not Properties:
            raise IndexRefused("the index declares a tensor without its properties")


class BytesEntry(Record):
    __slots__ = ()


class Properties(Record):
    """A tensor's dtype (DCP's ``TensorProperties``, pickled as the tuple (dtype, layout, requires_grad, memory
    format, pin_memory), or as a dict of those fields by older versions)."""

    __slots__ = ("dtype",)

    def build(self, state) -> None:
        dtype = state[0] if type(state) is tuple and state else state.get("dtype") if type(state) is dict else None
        if not isinstance(dtype, torch.dtype):
            raise IndexRefused("the index gives a tensor's properties without a dtype")
        self.dtype = dtype


class Chunk(Record):
    __slots__ = ("offsets", "sizes")


class StorageKey(Record):
    """Which value (by its name, ``fqn``) a stored slice holds, and where in the tensor for a chunk."""

    __slots__ = ("fqn", "offset", "index")

    def build(self, state) -> None:
        super().build(state)
        if type(self.fqn) is not str:  # a name is a key of the readers' dicts: no int whose hash a file chooses
            raise IndexRefused("the index names a stored value by something other than text")


class StorageInfo(Record):
    __slots__ = ("relative_path", "offset", "length", "transform_descriptors")


class StorageMeta(Record):
    __slots__ = ("checkpoint_id", "save_id", "load_id", "modules")


class _Global:
    """What a global of the index stands for: a record type (for NEWOBJ) or a function of ours (for REDUCE)."""

    __slots__ = ("name", "make", "record")

    def __init__(self, name: str, make, record: bool = False):
        self.name, self.make, self.record = name, make, record


def _dims(values) -> tuple[int, ...]:
    if type(values) is not tuple and type(values) is not list:
        raise IndexRefused("the index makes a torch.Size of something other than integers")
    return tuple(map(int.__index__, values))  # a TypeError for anything but an int


def _text(*values) -> tuple:
    if any(type(v) is not str for v in values):
        raise IndexRefused("the index makes a path of something other than text")
    return values


_LAYOUTS = {str(v) for v in vars(torch).values() if isinstance(v, torch.layout)}
_DTYPES = {name: v for name, v in vars(torch).items() if isinstance(v, torch.dtype)}  # no lazy import of torch's


def _layout(name) -> str:
    if name not in _LAYOUTS:
        raise IndexRefused(f"the index names an unknown layout {str(name)[:40]!r}")
    return name


def _memory_format(number) -> int:
    if type(number) is not int:
        raise IndexRefused("the index gives a memory format that is no number")
    return number


def _empty_dict(*args) -> dict:
    if args:
        raise IndexRefused("the index makes an OrderedDict from arguments")
    return {}


_DCP = "torch.distributed.checkpoint.metadata"
_GLOBALS = {
    **{(_DCP, name): _Global(f"{_DCP}.{name}", record, record=True) for name, record in (
        ("Metadata", Index), ("TensorStorageMetadata", TensorEntry), ("BytesStorageMetadata", BytesEntry),
        ("TensorProperties", Properties), ("ChunkStorageMetadata", Chunk), ("MetadataIndex", StorageKey),
        ("StorageMeta", StorageMeta))},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _Global("_StorageInfo", StorageInfo, record=True),
    ("torch", "Size"): _Global("torch.Size", _dims),
    ("torch.serialization", "_get_layout"): _Global("torch.serialization._get_layout", _layout),
    (_DCP, "_MEM_FORMAT_ENCODING"): _Global(f"{_DCP}._MEM_FORMAT_ENCODING", _memory_format),
    ("collections", "OrderedDict"): _Global("collections.OrderedDict", _empty_dict),
    **{("pathlib", name): _Global(f"pathlib.{name}", lambda *parts, kind=kind: str(kind(*_text(*parts))))
       for name, kind in (("PosixPath", PurePosixPath), ("PurePosixPath", PurePosixPath),
                          ("WindowsPath", PureWindowsPath), ("PureWindowsPath", PureWindowsPath))},
}
_RECORD_BYTES = {g.make: sys.getsizeof(g.make.__new__(g.make)) for g in _GLOBALS.values() if g.record}
_KEY_TYPES = frozenset({str, *_RECORD_BYTES})


def _global(module, name):
    """The stand-in for a global the index names; a global outside DCP's records is refused unimported."""
    if type(module) is not str or type(name) is not str:
        raise IndexRefused("the index names a global by something other than text")
    found = _GLOBALS.get((module, name)) or (_DTYPES.get(name) if module == "torch" else None)
    if found is None:
        raise IndexRefused(f"the index names {module[:80]}.{name[:80]}, which a checkpoint index does not hold")
    return found


def _what(obj) -> str:
    return obj.name if type(obj) is _Global else "nothing" if obj is None else f"a {type(obj).__name__}"


def _fill(obj, state, unbuilt: dict) -> None:
    """BUILD: ``state`` into a record this read made and has not filled; anything else is refused."""
    if unbuilt.pop(id(obj), None) is not obj:
        raise IndexRefused(f"the index's BUILD opcode would set attributes of {_what(obj)}, not of a record it made")
    obj.build(state)


def _set_items(stack: list, at: int) -> None:
    """SETITEM(S): the items from ``stack[at]`` on (key, value, key...) into the dict below them, one the read made,
    under keys whose hash the file cannot choose."""
    target = stack[at - 1] if at > 0 else None
    if type(target) is not dict or (len(stack) - at) % 2:
        raise IndexRefused(f"the index sets items of {_what(target)}")
    if not set(map(type, islice(stack, at, None, 2))) <= _KEY_TYPES:
        raise IndexRefused("the index has dict keys other than names and records (a file could choose their hashes)")
    target.update(zip(islice(stack, at, None, 2), islice(stack, at + 1, None, 2)))


def _string(data: bytes, start: int, length: int) -> str:
    if start + length > len(data):
        raise IndexRefused("the index is cut short")
    return str(data[start:start + length], "utf-8", "surrogatepass")


def _put(memo: list, at: int, value) -> None:
    """BINPUT: pickle.dump numbers what it keeps in order; a number past the next one is refused."""
    if at > len(memo):
        raise IndexRefused("the index keeps an object under a number out of order")
    if at == len(memo):
        memo.append(value)
    else:
        memo[at] = value


def _rare(op: int, data: bytes, pos: int, stack: list, marks: list, memo: list) -> tuple[int, int]:
    """The opcodes a DCP index holds few or none of (``_read_opcodes`` reads the others): (where the next one
    starts, the bytes this one added)."""
    if op == 0x80:  # PROTO
        return pos + 1, 0
    if op == 0x95:  # FRAME: its opcodes follow as they are
        return pos + 8, 0
    if op in (0x58, 0x8D):  # BINUNICODE, BINUNICODE8
        width = 4 if op == 0x58 else 8
        length = int.from_bytes(data[pos:pos + width], "little")
        stack.append(_string(data, pos + width, length))
        return pos + width + length, 8 + sys.getsizeof(stack[-1])
    if op == 0x8A:  # LONG1
        length = data[pos]
        stack.append(int.from_bytes(data[pos + 1:pos + 1 + length], "little", signed=True))
        return pos + 1 + length, 48 + length
    if op in (0x71, 0x72):  # BINPUT, LONG_BINPUT
        width = 1 if op == 0x71 else 4
        _put(memo, int.from_bytes(data[pos:pos + width], "little"), stack[-1])
        return pos + width, 8
    if op == 0x73 or op == 0x61:  # SETITEM, APPEND
        at = len(stack) - (2 if op == 0x73 else 1)
        (_set_items if op == 0x73 else _append)(stack, at)
        del stack[at:]
        return pos, 60 if op == 0x73 else 16
    if op == 0x30:  # POP: the object on top, or the mark there
        marks.pop() if marks and marks[-1] == len(stack) else stack.pop()
        return pos, 0
    if op == 0x31:  # POP_MARK
        del stack[marks.pop():]
        return pos, 0
    if op == 0x63:  # GLOBAL: "module\nname\n"
        first = data.find(b"\n", pos, pos + 512)  # names of at most 511 bytes: every search is bounded
        second = data.find(b"\n", first + 1, first + 513) if first >= 0 else -1
        if second < 0:
            raise IndexRefused("the index names a global without its end")
        stack.append(_global(_string(data, pos, first - pos), _string(data, first + 1, second - first - 1)))
        return second + 1, 8
    if op == 0x93:  # STACK_GLOBAL
        name = stack.pop()
        stack[-1] = _global(stack[-1], name)
        return pos, 0
    raise IndexRefused(f"the index holds the opcode {bytes([op])!r}, which a checkpoint index does not")


def load_index(data: bytes, budget: int):
    """The object the pickle ``data`` holds, built as the module's docstring says: ``IndexRefused`` for anything
    else, ``IndexTooLarge`` once what it has built passes ``budget`` bytes."""
    collecting = gc.isenabled()
    gc.disable()  # what is built holds no cycle to free, and is counted: a 107 MiB index in 31 s of CPU, not 39
    try:
        return _read_opcodes(data, budget)
    except IndexError:
        raise IndexRefused("the index is cut short, or refers to an object it has not built") from None
    finally:
        if collecting:
            gc.enable()


def _read_opcodes(data: bytes, budget: int):
    """``load_index``'s loop: the opcodes DCP's records are made of (most of an index) here, the rest in ``_rare``;
    ``held`` counts the bytes what was read takes."""
    stack, marks, memo, unbuilt = [], [], [], {}
    push, pop = stack.append, stack.pop
    pos = held = 0
    while held <= budget:
        op = data[pos]
        pos += 1
        if op == 0x94:  # MEMOIZE
            memo.append(stack[-1])
            held += 8
        elif op == 0x6A:  # LONG_BINGET
            push(memo[int.from_bytes(data[pos:pos + 4], "little")])
            pos += 4
            held += 8
        elif op == 0x68:  # BINGET
            push(memo[data[pos]])
            pos += 1
            held += 8
        elif op == 0x4B:  # BININT1
            push(data[pos])
            pos += 1
            held += 8
        elif op == 0x28:  # MARK
            marks.append(len(stack))
            held += 8
        elif op in _CONSTANTS:  # EMPTY_TUPLE, NONE, NEWTRUE, NEWFALSE
            push(_CONSTANTS[op])
            held += 8
        elif op == 0x81:  # NEWOBJ
            args = pop()
            stack[-1] = _new_record(stack[-1], args, unbuilt)
            held += _RECORD_BYTES[type(stack[-1])] + 40
        elif op == 0x62:  # BUILD
            state = pop()
            _fill(stack[-1], state, unbuilt)
        elif op == 0x75 or op == 0x65 or op == 0x74:  # SETITEMS, APPENDS, TUPLE: the objects since the mark
            at = marks.pop()
            if at > len(stack):  # an opcode took objects from below the mark: no count may go negative
                raise IndexRefused("the index takes objects from below a mark")
            held += _ITEM_BYTES[op] * (len(stack) - at) + 8  # counted before they are added
            if held > budget:
                break
            if op == 0x74:
                items = tuple(islice(stack, at, None))
            else:
                (_set_items if op == 0x75 else _append)(stack, at)
            del stack[at:]
            if op == 0x74:
                push(items)
        elif op == 0x7D or op == 0x5D:  # EMPTY_DICT, EMPTY_LIST
            push({} if op == 0x7D else [])
            held += 72
        elif op == 0x52:  # REDUCE
            args = pop()
            stack[-1] = _call(stack[-1], args)
            held += 8 + sys.getsizeof(stack[-1])
        elif 0x85 <= op <= 0x87:  # TUPLE1, TUPLE2, TUPLE3
            count = op - 0x84
            items = tuple(stack[-count:])
            del stack[-count:]
            push(items)
            held += 48 + 8 * count
        elif op == 0x8C:  # SHORT_BINUNICODE
            push(_string(data, pos + 1, data[pos]))
            pos += 1 + data[pos]
            held += 8 + sys.getsizeof(stack[-1])
        elif op == 0x4D or op == 0x4A:  # BININT2, BININT
            width = 2 if op == 0x4D else 4
            push(int.from_bytes(data[pos:pos + width], "little", signed=op == 0x4A))
            pos += width
            held += 40
        elif op == 0x2E:  # STOP
            return pop()
        else:
            pos, added = _rare(op, data, pos, stack, marks, memo)
            held += added
    raise IndexTooLarge(f"builds more than {budget:,} bytes of objects")


_CONSTANTS = {0x29: (), 0x4E: None, 0x88: True, 0x89: False}
# Bytes an item adds: to a dict (SETITEMS) 60 an entry of two items (a dict of n entries takes 37 to 57 n bytes); to
# a list (APPENDS) 8, and as much again while the stack it leaves is shrunk; to a tuple (TUPLE) 8.
_ITEM_BYTES = {0x75: 30, 0x65: 16, 0x74: 8}


def _new_record(kind, args, unbuilt: dict) -> Record:
    """NEWOBJ: a fresh record of a type ``_GLOBALS`` names, left for one BUILD to fill."""
    if type(kind) is not _Global or not kind.record or type(args) is not tuple or args:
        raise IndexRefused(f"the index makes an object of {_what(kind)}, which is no record of an index")
    record = kind.make.__new__(kind.make)
    unbuilt[id(record)] = record
    return record


def _call(call, args):
    """REDUCE: one of the functions of ``_GLOBALS``, never a class or function of the process."""
    if type(call) is not _Global or call.record or type(args) is not tuple:
        raise IndexRefused(f"the index calls {_what(call)}, which a checkpoint index does not")
    return call.make(*args)


def _append(stack: list, at: int) -> None:
    """APPEND(S): the items from ``stack[at]`` on to the list below them, one the read made."""
    target = stack[at - 1] if at > 0 else None
    if type(target) is not list:
        raise IndexRefused(f"the index appends to {_what(target)}")
    target.extend(islice(stack, at, None))
