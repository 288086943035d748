"""What `serve` takes from the network: whose X-Forwarded-For it believes, and (``models.common.serving``) how long a
client may take to send a request and how many connections may be open at once.

uvicorn on its own believes X-Forwarded-For and X-Forwarded-Proto from 127.0.0.1 (or $FORWARDED_ALLOW_IPS):
any local process, or anyone when the server sits on the same machine as a proxy that passes the header on,
could then claim a new client address per request and start as many raters as they liked. Here the headers
are read only from the proxies named with ``--trusted-proxy``, and not at all without one.
"""
from __future__ import annotations

import uvicorn

from models.common import allow_open_files as allow_files, deadline_protocol

# Open files `serve` needs besides its connections: 32 pooled SQLite connections with 3 files each (the
# database, its WAL and shared memory), an image file per worker thread (40), the interpreter's own.
FILES_BESIDES_CONNECTIONS = 256


def allow_open_files(max_connections: int) -> None:
    """This process's open-file limit raised for ``max_connections`` and the files `serve` keeps besides."""
    allow_files(max_connections, FILES_BESIDES_CONNECTIONS)


def uvicorn_config(app, *, trusted_proxies: list[str], request_timeout: float, max_connections: int):
    """The server's settings: quiet, no Server header, forwarded headers from `trusted_proxies` only, and
    ``models.common.serving``'s deadline and connection cap for HTTP."""
    return uvicorn.Config(app, http=deadline_protocol(request_timeout, max_connections), log_level="warning",
                          access_log=False, server_header=False, lifespan="off", timeout_keep_alive=30, timeout_graceful_shutdown=5,
                          proxy_headers=bool(trusted_proxies), forwarded_allow_ips=list(trusted_proxies))
