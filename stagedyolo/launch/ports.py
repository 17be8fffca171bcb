"""Finding a free TCP port for a rendezvous endpoint."""

from __future__ import annotations

import socket


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # No SO_REUSEADDR: we want to know whether a listener could bind *now*, and a port held by a live listener
        # must read as taken.
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(preferred: int = 29500, host: str = "127.0.0.1") -> int:
    """Return ``preferred`` if it can be bound on ``host``, else a port the OS picks as free.

    The port is only known to be free at the moment of the check: another process may take it before the caller
    binds it. Launches that must never clash should let the listener bind port 0 itself (build_stage_command does
    that by default) and use this only where a known port number is required up front.
    """
    if preferred and _can_bind(host, preferred):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
