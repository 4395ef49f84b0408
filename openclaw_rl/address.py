"""Where the proxy can be reached from elsewhere: the address it advertises in its log and run directory.

Stage: proxy (start-up). Under Slime the proxy runs inside the RolloutManager, a Ray actor that Ray may
place on any node, so the user (and OpenClaw) must learn which node it landed on. A proxy bound to a
concrete address advertises that address; one bound to a wildcard (``0.0.0.0``, ``::``) advertises
``advertise_host`` when set (``PROXY_ADVERTISE_HOST``), else the local address this machine would use
to reach ``MASTER_ADDR`` (the head node; a UDP ``connect`` sends no packet), else its host name's address.
The URL is written to ``proxy_address`` in the spool directory, which sits in the run directory.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

WILDCARDS = ("0.0.0.0", "::", "")
ADDRESS_FILE = "proxy_address"


def _route_source(toward: str) -> str | None:
    """The local address the kernel would send from toward ``toward`` (no packet is sent)."""
    try:
        family = socket.getaddrinfo(toward, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as sock:
            sock.connect(family[4])
            return str(sock.getsockname()[0])
    except OSError:
        return None


def advertised_host(bind_host: str, advertise_host: str = "", env: Mapping[str, str] | None = None) -> str:
    """The host name or address other machines use for a server bound to ``bind_host``."""
    if advertise_host:
        return advertise_host
    if bind_host.strip("[]") not in WILDCARDS:
        return bind_host
    env = os.environ if env is None else env
    head = env.get("MASTER_ADDR", "")
    source = _route_source(head) if head else None
    if source and source not in WILDCARDS:
        return source
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def advertised_url(bind_host: str, port: int, advertise_host: str = "", env: Mapping[str, str] | None = None) -> str:
    host = advertised_host(bind_host, advertise_host, env)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def write_address(spool_dir: str, url: str) -> Path | None:
    """``<spool dir>/proxy_address``: one line, the client base URL (``…/v1``), replaced atomically."""
    if not spool_dir:
        return None
    path = Path(spool_dir) / ADDRESS_FILE
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(f"{url}/v1\n")
        os.replace(tmp, path)
    except OSError as e:  # a record for people, not the spool: its failure must not stop the proxy
        log.warning("could not write the proxy's address to %s: %s", path, e)
        return None
    return path
