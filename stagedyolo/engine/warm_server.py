"""The warm server: `python -m stagedyolo.engine.warm_server <name> <idle_s>` imports torch and yolov5 once, then
forks each requested `python -m <module>` from that state (the client side is stagedyolo.launch.warm).

It is one thread, so a fork never copies a lock another thread holds, and it never touches CUDA: a child may
start CUDA only if its parent did not. The modules a request runs (the worker, the probe's child) and yolov5's
train.py (which the worker compiles with its own constants) are not kept: the child runs them fresh from source,
as `python -m` would. The server exits once it has had no child for idle_s seconds.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
import warnings

from stagedyolo.launch.parent_watch import exit_when_process_dies
from stagedyolo.launch.warm import MAX_MESSAGE, peer_credentials

# What a request runs (and yolov5's train.py, which the worker compiles itself): imported once here for everything
# they import, then dropped again so that every child runs them from source.
RUN_FRESH = ("yolov5.train", "stagedyolo.engine.worker", "stagedyolo.probe.child")
PRELOAD = ("torch", *RUN_FRESH)
_POLL_S = 0.2


def main(name: str, idle_s: float) -> int:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind("\0" + name)
    except OSError as error:  # another server won the race: the client uses that one
        print(f"warm server {name}: not starting, {error}", flush=True)
        return 0
    listener.listen(16)  # requests queue here while the imports run
    started = time.monotonic()
    preload()
    import torch

    if torch.cuda.is_initialized():  # a forked child could not use CUDA
        print(f"warm server {name}: CUDA was initialised while importing; exiting", flush=True)
        return 1
    print(f"warm server {name}: ready in {time.monotonic() - started:.1f} s (pid {os.getpid()})", flush=True)
    serve(listener, idle_s)
    print(f"warm server {name}: idle for {idle_s:g} s, exiting", flush=True)
    return 0


def preload() -> None:
    # The pkg_resources deprecation warning from yolov5's import goes to this server's log, not every stage's.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    for module in PRELOAD:
        importlib.import_module(module)
    for module in RUN_FRESH:
        sys.modules.pop(module, None)
        package, _, leaf = module.rpartition(".")
        if package in sys.modules and hasattr(sys.modules[package], leaf):
            delattr(sys.modules[package], leaf)


def serve(listener: socket.socket, idle_s: float) -> None:
    children: dict[int, socket.socket] = {}  # child pid -> the connection that gets its exit status
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    idle_since = time.monotonic()
    while children or time.monotonic() - idle_since < idle_s:
        if selector.select(timeout=_POLL_S):
            conn, _ = listener.accept()
            pid = fork_request(conn, listener, children)
            if pid is None:
                conn.close()
            else:
                children[pid] = conn
        reap(children)
        if children:
            idle_since = time.monotonic()


def fork_request(conn: socket.socket, listener: socket.socket, children: dict) -> int | None:
    """Read one request and fork its child; returns the child's pid, or None for a refused request."""
    conn.settimeout(10)
    try:
        message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        caller_pid, caller_uid, _ = peer_credentials(conn)
        request = json.loads(message)
    except (OSError, ValueError) as error:
        print(f"warm server: bad request: {error}", flush=True)
        return None
    if caller_uid != os.getuid() or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        _reply(conn, {"error": "refused: another user, or not three file descriptors"})
        return None
    session_ready, session_ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()  # its own group and session, like Popen(start_new_session=True): signals reach its tree
            os.close(session_ready)
            os.close(session_ready_w)  # the server may now report the pid
            listener.close()
            for other in (conn, *children.values()):
                other.close()
            code = run_child(request, fds, caller_pid)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in (*fds, session_ready_w):
        os.close(fd)
    # Only once the child leads its own group: the caller notes the groups of the processes it must end, and
    # until setsid the child is still in ours.
    os.read(session_ready, 1)
    os.close(session_ready)
    _reply(conn, {"pid": pid})
    return pid


def run_child(request: dict, fds: list[int], caller_pid: int) -> int:
    """In the forked child: become the process `python -m module args` would have been, run it, return its code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what `python -m` puts first
    sys.argv = [request["module"], *request["args"]]
    exit_when_process_dies(caller_pid)  # the caller (a stage's supervisor) is not our parent; watch it instead
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    _finish_like_interpreter()
    return code


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _finish_like_interpreter() -> None:
    """What the interpreter does at exit before os._exit: join non-daemon threads, run atexit, flush stdio."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _reply(conn, {"returncode": os.waitstatus_to_exitcode(status)})
            conn.close()


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:  # the caller is gone; its child watches for that itself
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
