"""What `serve` takes from the network: whose X-Forwarded-For it believes.

uvicorn on its own believes X-Forwarded-For and X-Forwarded-Proto from 127.0.0.1 (or $FORWARDED_ALLOW_IPS):
any local process, or anyone when the server sits on the same machine as a proxy that passes the header on,
could then claim a new client address per request and start as many raters as they liked. Here the headers
are read only from the proxies named with ``--trusted-proxy``, and not at all without one.
"""
from __future__ import annotations

import argparse
import ipaddress


def proxy_address(value: str) -> str:
    """``--trusted-proxy``'s argument: an IP address or a network (CIDR), written as uvicorn compares it."""
    try:
        if "/" in value:
            return str(ipaddress.ip_network(value, strict=False))  # uvicorn takes 10.0.0.1/8 for a name, not a network
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address or network: {value!r}") from None


def uvicorn_config(app, *, trusted_proxies: list[str]):
    """The server's settings: quiet, no Server header, forwarded headers from `trusted_proxies` only."""
    import uvicorn

    return uvicorn.Config(app, log_level="warning", access_log=False, server_header=False, lifespan="off",
                          timeout_keep_alive=30, timeout_graceful_shutdown=5,
                          proxy_headers=bool(trusted_proxies), forwarded_allow_ips=list(trusted_proxies))
