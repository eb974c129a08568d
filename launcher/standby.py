# gangrun's standby interpreter (launcher/warm.go). Started with a worker's
# interpreter, interpreter options and environment (less the per-attempt variables),
# it imports the heavy modules, says "ready" on fd 4 and blocks reading fd 3, a Unix
# socket. When gangrun activates it, it reads one JSON line {"env", "cwd", "argv",
# "script" | "module", "next"}, enters the working directory, says "go" on fd 4, takes
# the environment, closes both descriptors and runs the script or module as __main__ as
# a fresh interpreter would. End of input on fd 3 (gangrun dropped it) exits quietly.
#
# "next" (with four descriptors passed along the line: the next standby's stdout,
# stderr, fd 3 and fd 4) asks it, after "go", to fork the standby of the rank's next
# attempt: a copy of itself, its modules imported, before the attempt's environment is
# applied. The copy is double-forked, so that it is re-parented to gangrun (a child
# subreaper) and is not this worker's child; "next PID" on fd 4 tells gangrun its pid,
# "next" alone that it did not fork. It forks only while it has one thread (a fork
# copies only the calling thread: a lock another thread held would stay held in the
# copy).
import sys as _sys


def _recv_line(sock):
    """One line from the Unix socket sock and the descriptors passed along it: (b"", [])
    at end of input."""
    import array
    import socket

    buf, fds = b"", []
    while not buf.endswith(b"\n"):
        data, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
                fds.extend(a)
        if not data:
            for fd in fds:
                _close(fd)
            return b"", []
        buf += data
    return buf, fds


def _close(fd):
    import os
    try:
        os.close(fd)
    except OSError:
        pass


def _fork_next(fds, ppid):
    """Forks the next standby onto fds (its stdout, stderr, fd 3, fd 4), re-parented to
    ppid. Returns the copy's pid in the caller, None where it did not fork, and _COPY in
    the copy, set up to wait as a standby again."""
    import os

    if len(os.listdir("/proc/self/task")) != 1:
        return None
    for f in (_sys.stdout, _sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            if os.fork() == 0:
                _become_next(fds, w, os.getppid(), ppid)
                return _COPY
        except BaseException:
            pass
        os._exit(0)
    os.close(w)
    try:
        data = os.read(r, 32)
    finally:
        os.close(r)
    os.waitpid(mid, 0)
    try:
        return int(data)
    except ValueError:
        return None


_COPY = -1


def _become_next(fds, w, mid, ppid):
    """Sets up the forked copy: its own session (so that no signal to the worker's
    process group reaches it), its pid written to w only then, fds as its stdout,
    stderr, fd 3 and fd 4, and its parent ppid (gangrun) once the middle process is gone.
    It exits where any of that fails. It needs no parent-death signal: gangrun's end of
    its fd 3 closes when gangrun dies, which ends its wait."""
    import os
    import time

    try:
        os.setsid()
        os.write(w, b"%d" % os.getpid())
        os.close(w)
        for target, fd in zip((1, 2, 3, 4), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 4:
                _close(fd)
        for _ in range(5000):  # the middle process exits at once
            if os.getppid() != mid:
                break
            time.sleep(0.001)
        if os.getppid() != ppid:
            os._exit(0)  # gangrun is gone, or not a subreaper: it would not adopt this copy
        if "numpy" in _sys.modules:
            # A fresh interpreter's numpy seeds its global generator anew at import.
            _sys.modules["numpy"].random.seed()
        if "torch" in _sys.modules:
            # So does a fresh interpreter's torch its default CPU generator (not CUDA's,
            # whose default seed is fixed; torch.seed() would seed those too).
            _sys.modules["torch"].random.default_generator.seed()
    except BaseException:
        os._exit(1)


def _standby():
    import importlib
    import json
    import os
    import socket

    mods = [m for m in _sys.argv[1].split(",") if m] if len(_sys.argv) > 1 else []
    optional = len(_sys.argv) > 2 and _sys.argv[2] == "optional"
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:  # the script will meet the same error itself
            if not optional:
                # --warm-imports named it: a standby without it is no warm start, so
                # it says why and exits, and the attempt starts cold.
                print("gangrun standby: cannot import %s (--warm-imports): %s: the next attempt starts cold" % (m, e),
                      file=_sys.stderr, flush=True)
                os._exit(3)
    while True:
        ctrl = socket.socket(fileno=3)
        try:
            os.write(4, b"ready\n")
            line, fds = _recv_line(ctrl)
        except OSError:
            os._exit(0)
        if not line:
            os._exit(0)
        req = json.loads(line)
        os.chdir(req["cwd"])
        os.write(4, b"go\n")
        nxt = req.get("next")
        if nxt and len(fds) == 4:
            pid = _fork_next(fds, nxt["ppid"])
            if pid == _COPY:
                ctrl.detach()  # fd 3 is the copy's own now
                continue
            os.write(4, b"next %d\n" % pid if pid else b"next\n")
        for fd in fds:
            _close(fd)
        if "mempolicy" in req:
            _set_mempolicy(req["mempolicy"])
        os.environ.clear()
        os.environ.update(req["env"])
        ctrl.close()
        _close(4)
        return req


def _set_mempolicy(mp):
    """Set this thread's NUMA memory policy (set_mempolicy(2), which acts on the calling
    thread: gangrun cannot set it from outside) to mp's {"mode", "nodes"}; the threads
    the script starts inherit it. Quietly nothing where the call is not known."""
    import ctypes
    import platform

    nr = {"x86_64": 238, "aarch64": 237, "ppc64le": 261}.get(platform.machine())
    if nr is None:
        return
    nodes = mp["nodes"] if mp["mode"] == 2 else mp["nodes"][:1]
    mask = (ctypes.c_ulong * 16)()
    for n in nodes:
        if 0 <= n < 1024:
            mask[n // 64] |= 1 << (n % 64)
    try:
        ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(nr), ctypes.c_long(mp["mode"]), mask, ctypes.c_ulong(16 * 64 + 1))
    except Exception:
        pass


def _run(req):
    import os
    import runpy
    import types

    _sys.argv[:] = req["argv"]
    if "module" in req:
        # python -m: sys.path[0] is the working directory; runpy sets sys.argv[0] to the
        # module's file and runs it in a fresh __main__, as the interpreter's own -m
        # does (through the same function where runpy has it, so that even a
        # traceback's frames are the same).
        _sys.path[0] = os.getcwd()
        as_main = getattr(runpy, "_run_module_as_main", None)
        if as_main is None:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            return
        _sys.modules["__main__"] = types.ModuleType("__main__")
        as_main(req["module"], alter_argv=True)
        return
    # python script.py: sys.path[0] is the script's directory (links resolved),
    # __file__ and the code's file name the absolute path, sys.argv[0] as given.
    # (runpy.run_path would set __file__ and sys.argv[0] both to the path as given.)
    path = os.path.abspath(req["script"])
    _sys.path[0] = os.path.dirname(os.path.realpath(path))
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        argv0 = getattr(_sys, "orig_argv", [_sys.executable])[0]
        print("%s: can't open file %r: [Errno %d] %s" % (argv0, path, e.errno, e.strerror), file=_sys.stderr)
        _sys.exit(2)
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = __builtins__
    from importlib.machinery import SourceFileLoader
    main.__loader__ = SourceFileLoader("__main__", path)
    _sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _code_of(frame, funcs):
    """frame's code when it is one of funcs', else None."""
    for f in funcs:
        if frame.f_code is f.__code__:
            return f.__code__
    return None


def _main():
    req = _standby()
    try:
        _run(req)
    except SystemExit:
        raise
    except BaseException as e:
        # Uncaught: the traceback without this program's frames, then exit 1 (or die of
        # SIGINT for KeyboardInterrupt), as the interpreter does.
        import os
        import signal
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code is _code_of(tb.tb_frame, (_main, _run)):
            tb = tb.tb_next
        e.__traceback__ = tb  # the hook prints the exception's own traceback
        _sys.excepthook(type(e), e, tb)
        if isinstance(e, KeyboardInterrupt):
            for s in (_sys.stdout, _sys.stderr):
                try:
                    s.flush()
                except Exception:
                    pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        _sys.exit(1)


_main()
