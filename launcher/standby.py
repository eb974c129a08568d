# gangrun's standby interpreter (launcher/warm.go). Started with a worker's
# interpreter, interpreter options and environment (less the per-attempt variables),
# it imports the heavy modules, says "ready" on fd 4 and blocks reading fd 3. When
# gangrun activates it, it reads one JSON line {"env", "cwd", "argv", "script" |
# "module"}, takes that environment and working directory, says "go" on fd 4, closes
# both descriptors and runs the script or module as __main__ as a fresh interpreter
# would. End of input on fd 3 (gangrun dropped it) exits quietly.
import sys as _sys


def _standby():
    import importlib
    import json
    import os

    mods = [m for m in _sys.argv[1].split(",") if m] if len(_sys.argv) > 1 else []
    optional = len(_sys.argv) > 2 and _sys.argv[2] == "optional"
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:  # the script will meet the same error itself
            if not optional:
                print("gangrun standby: cannot import %s: %s" % (m, e), file=_sys.stderr, flush=True)
    ctrl = os.fdopen(3, "rb")
    ack = os.fdopen(4, "wb", buffering=0)
    try:
        ack.write(b"ready\n")
        line = ctrl.readline()
    except OSError:
        os._exit(0)
    if not line:
        os._exit(0)
    req = json.loads(line)
    if "mempolicy" in req:
        _set_mempolicy(req["mempolicy"])
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    ack.write(b"go\n")
    ack.close()
    ctrl.close()
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
