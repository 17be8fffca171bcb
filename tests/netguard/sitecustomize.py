"""Loaded by every Python process of a test run (PYTHONPATH): records each attempt to reach the network.

An attempt is a DNS look-up of a non-local name or a connect() to a non-loopback address. Each is appended to
the file named by STAGEDYOLO_NET_LOG, with the process and a short stack, so a test can assert there were none.
"""

import os
import socket
import traceback

_LOG = os.environ.get("STAGEDYOLO_NET_LOG")
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "", None}


def _record(what):
    with open(_LOG, "a") as handle:
        stack = "".join(traceback.format_stack(limit=8)[:-2])
        handle.write(f"pid {os.getpid()}: {what}\n{stack}\n")


def _is_remote(address):
    if not isinstance(address, tuple) or not address:
        return False  # AF_UNIX paths: multiprocessing, dataloader workers
    host = str(address[0])
    return not (host.startswith("127.") or host in _LOCAL_NAMES or host == "0.0.0.0")


if _LOG:
    _connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def connect(self, address):
        if _is_remote(address):
            _record(f"connect {address!r}")
        return _connect(self, address)

    def connect_ex(self, address):
        if _is_remote(address):
            _record(f"connect_ex {address!r}")
        return _connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in _LOCAL_NAMES and not str(host).startswith("127."):
            _record(f"getaddrinfo {host!r}")
        return _getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
