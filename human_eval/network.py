"""What `serve` takes from the network: whose X-Forwarded-For it believes, how long a client may take to send
a request, and how many connections may be open at once.

uvicorn on its own believes X-Forwarded-For and X-Forwarded-Proto from 127.0.0.1 (or $FORWARDED_ALLOW_IPS):
any local process, or anyone when the server sits on the same machine as a proxy that passes the header on,
could then claim a new client address per request and start as many raters as they liked. Here the headers
are read only from the proxies named with ``--trusted-proxy``, and not at all without one.

uvicorn's HTTP protocol also waits for a request's head for ever (its keep-alive timer runs only after a
response), so 1,500 half-sent requests were all still open after 45 s, and its ``limit_concurrency`` only
answers 503 to requests once the limit is reached: the connections themselves are still accepted, and
hold a file descriptor each. `DeadlineProtocol` closes a connection whose request (head and body) has not
arrived within ``--request-timeout`` seconds of its first byte, or of connecting, and closes connections
beyond ``--max-connections`` as they open.
"""
from __future__ import annotations

from functools import partial

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import HumanEvalError

# Open files `serve` needs besides its connections: 32 pooled SQLite connections with 3 files each (the
# database, its WAL and shared memory), an image file per worker thread (40), the interpreter's own.
FILES_BESIDES_CONNECTIONS = 256
WAITING = (h11.IDLE, h11.SEND_BODY)  # the client's h11 states while its request is not complete


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request to arrive and a cap on open connections."""

    def __init__(self, *args, request_timeout: float, max_connections: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.request_timeout, self.max_connections = request_timeout, max_connections
        self.deadline = None  # asyncio.TimerHandle while a request is awaited

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # this one included
            transport.close()
        else:
            self.start_deadline()

    def data_received(self, data: bytes) -> None:
        if self.deadline is None and self.conn.their_state is h11.IDLE:
            self.start_deadline()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state not in WAITING:
            self.stop_deadline()

    def connection_lost(self, exc) -> None:
        self.stop_deadline()
        super().connection_lost(exc)

    def start_deadline(self) -> None:
        self.deadline = self.loop.call_later(self.request_timeout, self.transport.close)

    def stop_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None


def allow_open_files(max_connections: int) -> None:
    """Raise this process's soft limit on open files to what `max_connections` needs, within the hard limit."""
    import resource

    need = max_connections + FILES_BESIDES_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise HumanEvalError(f"--max-connections {max_connections} needs {need} open files and the limit is {hard} "
                             f"(ulimit -Hn): pass at most --max-connections {hard - FILES_BESIDES_CONNECTIONS}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def uvicorn_config(app, *, trusted_proxies: list[str], request_timeout: float, max_connections: int):
    """The server's settings: quiet, no Server header, forwarded headers from `trusted_proxies` only, and
    `DeadlineProtocol` for HTTP."""
    protocol = partial(DeadlineProtocol, request_timeout=request_timeout, max_connections=max_connections)
    return uvicorn.Config(app, http=protocol, log_level="warning", access_log=False, server_header=False,
                          lifespan="off", timeout_keep_alive=30, timeout_graceful_shutdown=5,
                          proxy_headers=bool(trusted_proxies), forwarded_allow_ips=list(trusted_proxies))
