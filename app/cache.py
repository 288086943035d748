"""A least-recently-used cache of loaded pipelines, freeing memory when one is evicted."""
from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import torch


@dataclass
class CacheStats:
    hits: int = 0
    loads: int = 0
    evictions: int = 0


class PipelineCache:
    """At most ``max_size`` pipelines, keyed by (checkpoint, weights, version); the least recently used goes first.

    Loads of the same key wait for one another (a checkpoint is loaded once, not once per request);
    loads of different keys run side by side. When the cache is full, the least recently used pipeline
    is dropped before a new one loads, not after: at full size on a CPU, with ``--cache-size 1``, the app's
    peak memory was two pipelines and one checkpoint's pages (15.3 GB) when it evicted after loading. An
    evicted pipeline is garbage collected and, on a GPU, its memory handed back with
    ``torch.cuda.empty_cache()``; requests still running on it keep their reference until they finish.
    """

    def __init__(self, max_size: int = 2):
        if max_size < 1:
            raise ValueError("the pipeline cache holds at least one pipeline")
        self.max_size = max_size
        self.stats = CacheStats()
        self._items: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[Hashable, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def keys(self) -> list[Hashable]:
        """Least recently used first."""
        with self._lock:
            return list(self._items)

    def get(self, key: Hashable, load: Callable[[], object]):
        """The cached pipeline for ``key``, or ``load()``'s result, cached (evicting the oldest if full)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.stats.hits += 1
                return self._items[key]
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:  # another request may have loaded it while this one waited
                if key in self._items:
                    self._items.move_to_end(key)
                    self.stats.hits += 1
                    return self._items[key]
                made_room = self._evict(self.max_size - 1)
            if made_room:
                self._free()
            try:
                value = load()  # outside the cache lock: a slow load does not block hits on other keys
            except BaseException:
                with self._lock:
                    self._loading.pop(key, None)
                raise
            with self._lock:
                self._items[key] = value
                self.stats.loads += 1
                self._loading.pop(key, None)
                evicted = self._evict(self.max_size)  # loads of other keys ran beside this one
        if evicted:
            self._free()
        return value

    def _evict(self, keep: int) -> int:
        """Drop the least recently used pipelines until ``keep`` are left (under ``_lock``); how many went."""
        n = 0
        while len(self._items) > keep:
            self._items.popitem(last=False)
            self.stats.evictions += 1
            n += 1
        return n

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
        self._free()

    @staticmethod
    def _free() -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
