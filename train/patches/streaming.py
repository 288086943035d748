"""Streaming's internals that test sessions correct, written against Streaming (mosaicml-streaming) 0.13.0.

**Shared memory in one process** (``release_streaming_shared_memory``). Streaming 0.13.0's ``SharedMemory``
(``streaming/base/shared/memory.py``) keeps every block it creates or opens (``created_shms``, ``opened_shms``)
until the process exits: ``SharedMemory.__init__`` registers ``SharedMemory.cleanup`` with ``atexit`` and nothing
frees them earlier. A dataset holds about a dozen file descriptors; a training process makes a handful of
datasets, a test session hundreds, and ran out of file descriptors (the leak reported upstream as
mosaicml/streaming#457, and "Too many open files" in mosaicml/llm-foundry#406). Within the context, every
``SharedMemory`` made is recorded (its ``__init__`` wrapped, then restored); at its end each one's blocks are
closed (and unlinked where it created them) and its ``atexit`` handler dropped. A block still referenced is
left to exit, as before. Used by `tests/conftest.py` around each test module; training does not need it.
"""
from __future__ import annotations

import atexit
import contextlib

# The version this module was written and tested against (`tests/train/test_compat.py` compares it).
WRITTEN_FOR = {"mosaicml-streaming": "0.13.0"}


@contextlib.contextmanager
def release_streaming_shared_memory():
    """Free the shared memory of the Streaming datasets made inside the context, when it ends (see above)."""
    from streaming.base.shared import memory

    created, original = [], memory.SharedMemory.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    memory.SharedMemory.__init__ = tracking_init
    try:
        yield
    finally:
        memory.SharedMemory.__init__ = original
        for shm in created:
            atexit.unregister(shm.cleanup)
            for block in (*shm.created_shms, *shm.opened_shms):
                try:
                    block.close()
                except (BufferError, OSError):
                    continue  # still referenced; freed at exit as before
                if block in shm.created_shms:
                    try:
                        block.unlink()
                    except (FileNotFoundError, OSError):
                        pass
