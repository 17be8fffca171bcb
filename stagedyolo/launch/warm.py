"""Warm start: `python -m <module> <args>` forked from a process that already imported torch and yolov5.

Every stage and the probe runs in a process of its own (yolov5 keeps global state), and each such process used to
spend 6-7 s of a 2-core machine importing torch, torchvision and yolov5 before its first batch. A warm server
(stagedyolo.engine.warm_server) does those imports once per run and forks one child per request; the child is
the stage process, exactly as `python -m` would have started it: its own session, the caller's environment,
working folder, stdin, stdout and stderr, and its exit status reported back. The caller gets a Popen-like
WarmChild, so run_supervised forwards signals, samples and ends its process tree as before.

Anything unusual starts cold instead (start_warm returns None): a command that is not a plain `python -m`, such as
torchrun; stdout=PIPE; a server that cannot start or preload. The server is per user and per import-time inputs
(interpreter, package sources, environment); it refuses other users' connections and exits when idle.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import psutil

from .process_tree import is_running

SERVER_MODULE = "stagedyolo.engine.warm_server"
# Set in a warm child's environment: when its caller asked for it. The worker counts its set-up from there, so a
# first stage that waited for a new server's imports reports them as imports, as a cold start would.
REQUESTED_AT_ENV = "STAGEDYOLO_WARM_REQUESTED_UNIX"
# Not part of a server's identity: set per job (by Snakemake, the stage or the probe) and read by libraries only
# when they start threads or CUDA, which the child does after the fork; or set by importing cv2, which the server
# does too. Every other variable is part of the identity.
NOT_IDENTITY_ENV = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PWD", "OLDPWD", "_",
    "LD_LIBRARY_PATH", "QT_QPA_FONTDIR", "QT_QPA_PLATFORM_PLUGIN_PATH", REQUESTED_AT_ENV,
})  # fmt: skip
MAX_MESSAGE = 1 << 20
# The first request waits while a new server imports torch and yolov5 (about as long as a cold start would).
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WarmStart:
    """Where a warm server keeps its log, and how long it stays up without a child to run."""

    home: Path
    idle_s: float = 30.0


def warm_start_for(engine: dict | None, engine_home: Path) -> WarmStart | None:
    """The config's `engine` section (warm_start, warm_idle_s) as a WarmStart for `engine_home`; None when it is off."""
    engine = engine or {}
    if not engine.get("warm_start", True):
        return None
    return WarmStart(Path(engine_home), idle_s=engine.get("warm_idle_s", WarmStart.idle_s))


def server_name(env: Mapping[str, str]) -> str:
    """The server's abstract socket name: one server per user, interpreter, package sources and environment."""
    identity = hashlib.sha256()
    for part in (sys.executable, str(os.getuid()), *_source_stamps()):
        identity.update(part.encode() + b"\0")
    for key in sorted(set(env) - NOT_IDENTITY_ENV):
        identity.update(f"{key}={env[key]}".encode() + b"\0")
    return f"stagedyolo-warm-{os.getuid()}-{identity.hexdigest()[:24]}"


def _source_stamps() -> list[str]:
    """Size and mtime of every stagedyolo source file, and of torch's and yolov5's: an edit means a new server."""
    package = Path(__file__).resolve().parents[1]
    stamps = [f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for path in sorted(package.rglob("*.py"))]
    for name in ("torch", "yolov5"):
        spec = find_spec(name)
        if spec is not None and spec.origin:
            stat = os.stat(spec.origin)
            stamps.append(f"{spec.origin}:{stat.st_size}:{stat.st_mtime_ns}")
    return stamps


def plain_module_command(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(module, args) for `[sys.executable, "-m", module, *args]`; None for any other command."""
    argv = list(argv)
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return argv[2], argv[3:]
    return None


class WarmChild:
    """The part of subprocess.Popen that run_supervised uses, for a child of the warm server."""

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        try:
            self._process: psutil.Process | None = psutil.Process(pid)  # remembers the start time: no PID reuse
        except psutil.NoSuchProcess:
            self._process = None

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left < 0:
                raise subprocess.TimeoutExpired(["warm child", str(self.pid)], timeout)
            if self._conn is not None:
                self._read_status(left)
            elif is_running(self._process):  # the server went away before the child: poll the child itself
                time.sleep(0.1 if left is None else min(0.1, left))
            else:
                self.returncode = 1  # its exit status went with the server
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None and is_running(self._process):
            os.kill(self.pid, signal.SIGKILL)

    def _read_status(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        try:
            message = self._conn.recv(MAX_MESSAGE)
        except OSError:
            message = b""
        if message:
            self.returncode = int(json.loads(message)["returncode"])
        if not message or self.returncode is not None:
            self._conn.close()
            self._conn = None


def start_warm(argv: Sequence[str], env: Mapping[str, str], warm: WarmStart, *, cwd=None, stdout=None,
               stderr=None, log=None) -> WarmChild | None:  # fmt: skip
    """Start ``argv`` as a child of the warm server (starting the server if needed); None means start it cold.

    ``stdout``/``stderr`` take what subprocess takes, except PIPE. ``log`` (a text file) gets one line saying
    how the process started.
    """
    command = plain_module_command(argv)
    if command is None or subprocess.PIPE in (stdout, stderr):
        return None
    name = server_name(env)
    requested_at = time.time()
    conn = _connect(name)
    started_server = conn is None
    if conn is None:
        conn = _start_server(name, env, warm)
    if conn is None:
        _note(log, "warm start: no server could start; starting cold (see the server log in the engine folder)")
        return None
    fds = _child_fds(stdout, stderr)
    try:
        request = {"module": command[0], "args": command[1], "env": {**env, REQUESTED_AT_ENV: f"{requested_at:.6f}"},
                   "cwd": str(cwd or os.getcwd())}  # fmt: skip
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        ready, _, _ = select.select([conn], [], [], START_TIMEOUT_S)
        reply = json.loads(conn.recv(MAX_MESSAGE) or b"{}") if ready else {}
    except OSError:
        reply = {}
    finally:
        for fd in fds:
            os.close(fd)
    if "pid" not in reply:
        conn.close()
        _note(log, f"warm start: the server did not start the process ({reply.get('error', 'no reply')}); "
                   "starting cold")  # fmt: skip
        return None
    _note(log, f"warm start: pid {reply['pid']} forked from {'a new' if started_server else 'the running'} "
               f"warm server ({name})")  # fmt: skip
    return WarmChild(int(reply["pid"]), conn)


def _connect(name: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect("\0" + name)
        return conn
    except OSError as error:
        conn.close()
        if error.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
        return None


def _start_server(name: str, env: Mapping[str, str], warm: WarmStart) -> socket.socket | None:
    """Start a server in its own session and connect to it; it binds at once, then imports while we queue."""
    home = Path(warm.home)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "warm_server.log", "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, name, str(warm.idle_s)], env=dict(env), cwd=home,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        conn = _connect(name)
        if conn is not None:
            return conn
        if server.poll() is not None:
            return _connect(name)  # it lost the race to another server, which we use; else it failed
        time.sleep(0.05)
    return None


def _child_fds(stdout, stderr) -> list[int]:
    """Duplicates of the child's stdin (/dev/null), stdout and stderr, for sending; the caller closes them."""
    stdin_fd = os.open(os.devnull, os.O_RDONLY)
    out_fd = _dup_target(stdout, default=1)
    err_fd = os.dup(out_fd) if stderr == subprocess.STDOUT else _dup_target(stderr, default=2)
    return [stdin_fd, out_fd, err_fd]


def _dup_target(target, default: int) -> int:
    if target is None:
        return os.dup(default)
    if target == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY)
    return os.dup(target if isinstance(target, int) else target.fileno())


def _note(log, line: str) -> None:
    if log is not None:
        log.write(f"stagedyolo: {line}\n")
        log.flush()


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
