"""What the workbench's servers (the rating server, the app) take from the network: how long a client may
take to send a request, and how many connections may be open at once.

uvicorn's HTTP protocol waits for a request's head for ever (its keep-alive timer runs only after a
response): 1,500 half-sent requests were all still open after 45 s at the rating server, and after 65 s at
the app, one file descriptor each; under the common limit of 1,024 open files the app then answered nobody.
Its ``limit_concurrency`` only answers 503 to requests once the limit is reached: the connections themselves
are still accepted. `DeadlineProtocol` closes a connection whose request (head and body) has not arrived
within ``request_timeout`` seconds of its first byte, or of connecting, and closes connections beyond
``max_connections`` as they open. A response, however long it streams, is not timed.
"""
from __future__ import annotations

from functools import partial

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import WorkbenchError

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


def allow_open_files(max_connections: int, besides: int) -> None:
    """Raise this process's soft limit on open files to what ``max_connections`` and ``besides`` other files need,
    within the hard limit."""
    import resource

    need = max_connections + besides
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise WorkbenchError(f"--max-connections {max_connections} needs {need} open files and the limit is {hard} "
                             f"(ulimit -Hn): pass at most --max-connections {hard - besides}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def deadline_protocol(request_timeout: float, max_connections: int) -> partial:
    """uvicorn's ``http`` setting for `DeadlineProtocol` with these limits."""
    return partial(DeadlineProtocol, request_timeout=request_timeout, max_connections=max_connections)
