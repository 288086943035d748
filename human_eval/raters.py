"""Who a rater is: ids, the server-issued keys that prove them, and how fast new raters may appear.

A rater id names a rater; it is not a secret, and a typed id proves nothing. What lets a browser (or a
crowd worker's link) act as a rater is the rater's key, HMAC-SHA256 of the id under the study's secret:
the server hands it out once, when it creates the rater, and every later request carries it. Typing an
id, known or not, always creates a *new* rater labelled with what was typed, so the answer never tells
whether an id exists. `dwb human-eval links` writes per-rater links (id and key) for crowd platforms.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
import threading
import time

RATER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")  # always with fullmatch: `$` would let "id\n" through
KEY_HEADER = "X-Rater-Key"


def valid_rater_id(rater: str) -> bool:
    """1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit; nothing else, no newline."""
    return RATER_ID.fullmatch(rater) is not None


def new_rater_id() -> str:
    return f"r-{secrets.token_hex(6)}"


def rater_key(secret: str, rater: str) -> str:
    """The rater's key: 128 bits of HMAC-SHA256(study secret, rater id), URL-safe base64 (22 characters)."""
    digest = hmac.new(secret.encode(), b"rater-key\0" + rater.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")


def key_matches(secret: str, rater: str, key: str | None) -> bool:
    """Constant-time check of a presented key."""
    return bool(key) and hmac.compare_digest(rater_key(secret, rater).encode(), key.encode())


class NewRaterLimit:
    """A token bucket per client address: at most `per_minute` new raters a minute, in bursts of that many.

    Only requests that would create a rater count; a returning rater with their key is never limited.
    """

    def __init__(self, per_minute: int, max_addresses: int = 10000):
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # tokens a second
        self.max_addresses = max_addresses
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, address: str) -> float:
        """0 when a new rater may be created now (and counts it), else the seconds to wait."""
        if self.capacity <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(address, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - at) * self.rate)
            if tokens < 1:
                self._buckets[address] = (tokens, now)
                return math.ceil((1 - tokens) / self.rate)
            self._buckets[address] = (tokens - 1, now)
            if len(self._buckets) > self.max_addresses:  # forget addresses whose bucket has refilled
                full = [a for a, (t, s) in self._buckets.items() if t + (now - s) * self.rate >= self.capacity]
                for a in full:
                    del self._buckets[a]
            return 0.0
