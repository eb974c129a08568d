"""Cuts a real trainer's save short with SIGKILL, at every point of its write.

checkpoint/trainers_test.go runs the scripts beside this module. Each trains a tiny model
on CPU with its library and, at the save to be cut, calls fork_cuts with the library's own
save call: for N = 1, 2, ... a forked child makes that save with the N-th write event
armed, and kills itself with SIGKILL there (os.kill(os.getpid(), SIGKILL), nothing
flushed, no finally blocks run); the parent moves the tree the child left to
RESULTS/cut-N and puts the output directory back as it was before the save. The first N
the child survives is the whole save (RESULTS/whole), and the loop ends.

The write events, counted only for paths inside the output directory:
  create PATH        a file opened for writing (it exists, empty)
  write PATH #k      the k-th write to it (the first 3 of each file); the kill lands
                     after half of that write's bytes, as a crash in the middle of it
  close PATH         a file closed (its bytes handed to the kernel)
  rename SRC DST     os.rename / os.replace / shutil.move done
  mkdir PATH         a directory made (os.makedirs makes each through os.mkdir)
  symlink PATH       a symbolic link made
  remove PATH        a file, directory or tree removed (rotation of old checkpoints;
                     shutil.rmtree's removals one by one)
torch.save and safetensors' save_file to a path write from C++ and Rust, out of Python's
sight; for them the events are "create", "half" (the first half of the bytes the call
writes: torch.save's or safetensors' own serialisation, cut) and "close".
"""
import builtins
import io
import json
import os
import shutil
import signal
import sys
import threading
import traceback

import torch

try:
    import safetensors.torch as _st
except ImportError:  # the DCP script needs no safetensors
    _st = None

_lock = threading.Lock()
_state = {"root": None, "armed": 0, "count": 0, "log": None}
_WRITES_PER_FILE = 3

_real = {
    "open": builtins.open,
    "rename": os.rename,
    "replace": os.replace,
    "mkdir": os.mkdir,
    "symlink": os.symlink,
    "remove": os.remove,
    "unlink": os.unlink,
    "rmdir": os.rmdir,
    "rmtree": shutil.rmtree,
    "torch_save": torch.save,
    "st_save_file": _st.save_file if _st else None,
}


def _inside(path):
    root = _state["root"]
    if root is None or path is None or isinstance(path, int):
        return False
    try:
        p = os.path.realpath(os.fspath(path))
    except TypeError:
        return False
    return p == root or p.startswith(root + os.sep)


def _rel(path):
    return os.path.relpath(os.path.realpath(os.fspath(path)), _state["root"])


def _event(desc, before_kill=None):
    """Counts one write event; at the armed one, runs before_kill and dies by SIGKILL."""
    if not _state["armed"]:
        return
    with _lock:
        _state["count"] += 1
        n = _state["count"]
    if n != _state["armed"]:
        return
    if before_kill is not None:
        before_kill()
    os.write(_state["log"], (json.dumps({"n": n, "event": desc}) + "\n").encode())
    os.kill(os.getpid(), signal.SIGKILL)


class _File:
    """A file opened for writing inside the root: its writes and close are events."""

    def __init__(self, f, path):
        self._f, self._path, self._writes = f, path, 0

    def write(self, b):
        self._writes += 1
        if self._writes <= _WRITES_PER_FILE and len(b) > 0:
            def half():
                self._f.write(b[: len(b) // 2])
                self._f.flush()
            _event("write %s #%d" % (self._path, self._writes), half)
        return self._f.write(b)

    def close(self):
        closed = self._f.closed
        self._f.close()
        if not closed:
            _event("close " + self._path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _open(file, mode="r", *args, **kwargs):
    f = _real["open"](file, mode, *args, **kwargs)
    if any(c in mode for c in "wax+") and _state["armed"] and _inside(file):
        path = _rel(file)
        _event("create " + path)
        return _File(f, path)
    return f


def _renamer(name):
    real = _real[name]

    def fn(src, dst, *args, **kwargs):
        out = real(src, dst, *args, **kwargs)
        if _inside(dst):
            _event("rename %s %s" % (os.path.basename(os.fspath(src)), _rel(dst)))
        return out
    return fn


def _after(name, kind):
    real = _real[name]

    def fn(path, *args, **kwargs):
        full = path
        if kwargs.get("dir_fd") is not None and not isinstance(path, int):
            # shutil.rmtree removes entry by entry relative to a directory descriptor.
            full = os.path.join(os.readlink("/proc/self/fd/%d" % kwargs["dir_fd"]), os.fspath(path))
        inside = _inside(full)
        rel = _rel(full) if inside else None
        out = real(path, *args, **kwargs)
        if inside:
            _event("%s %s" % (kind, rel))
        return out
    return fn


def _symlink(src, dst, *args, **kwargs):
    out = _real["symlink"](src, dst, *args, **kwargs)
    if _inside(os.path.dirname(os.path.abspath(os.fspath(dst)))):
        _event("symlink " + os.path.relpath(os.path.abspath(os.fspath(dst)), _state["root"]))
    return out


def _serialised(path, serialise):
    """Events of a C++ or Rust writer to a path: create, half, close."""
    rel = _rel(path)
    if _state["armed"]:
        data = serialise()

        def create():
            _real["open"](path, "wb").close()

        def half():
            with _real["open"](path, "wb") as f:
                f.write(data[: len(data) // 2])
        _event("create " + rel, create)
        _event("half " + rel, half)
    return rel


def _torch_save(obj, f, *args, **kwargs):
    if isinstance(f, (str, os.PathLike)) and _state["armed"] and _inside(f):
        def serialise():
            buf = io.BytesIO()
            _real["torch_save"](obj, buf, *args, **kwargs)
            return buf.getvalue()
        rel = _serialised(f, serialise)
        out = _real["torch_save"](obj, f, *args, **kwargs)
        _event("close " + rel)
        return out
    return _real["torch_save"](obj, f, *args, **kwargs)


def _st_save_file(tensors, filename, metadata=None):
    if _state["armed"] and _inside(filename):
        rel = _serialised(filename, lambda: _st.save(tensors, metadata=metadata))
        out = _real["st_save_file"](tensors, filename, metadata=metadata)
        _event("close " + rel)
        return out
    return _real["st_save_file"](tensors, filename, metadata=metadata)


def install(root):
    """Patches the write calls; events count only under root, and only once armed.
    Call it before importing the trainer's library, which may bind save_file at import."""
    _state["root"] = os.path.realpath(root)
    builtins.open = _open
    io.open = _open
    os.rename = _renamer("rename")
    os.replace = _renamer("replace")
    os.mkdir = _after("mkdir", "mkdir")
    os.symlink = _symlink
    os.remove = _after("remove", "remove")
    os.unlink = _after("unlink", "remove")
    os.rmdir = _after("rmdir", "remove")
    shutil.rmtree = _after("rmtree", "remove")
    torch.save = _torch_save
    if _st is not None:
        _st.save_file = _st_save_file


def fork_cuts(save, out_dir, results, max_cuts=400, in_child=None):
    """Makes save() once per write event in forked children, each killed at its event;
    returns the list of {"n", "event", "dir"} cuts and the whole save's directory.
    out_dir is left as before the save. in_child, when given, runs first in each child
    (DeepSpeed's: a gloo process group's threads do not survive the fork)."""
    os.makedirs(results, exist_ok=True)
    before = os.path.join(results, "before")
    _copy(out_dir, before)
    logpath = os.path.join(results, "events.jsonl")
    cuts, whole = [], None
    for n in range(1, max_cuts + 1):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if in_child is not None:
                    in_child()
                _state["log"] = os.open(logpath, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                _state["armed"], _state["count"] = n, 0
                save()
                _state["armed"] = 0
            except BaseException:
                traceback.print_exc()
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        dest = os.path.join(results, "cut-%03d" % n)
        if os.WIFEXITED(status):
            if os.WEXITSTATUS(status) != 0:
                raise RuntimeError("the save failed in child %d (exit %d)" % (n, os.WEXITSTATUS(status)))
            dest = os.path.join(results, "whole")
        elif os.WTERMSIG(status) != signal.SIGKILL:
            raise RuntimeError("child %d died by signal %d" % (n, os.WTERMSIG(status)))
        _real["rename"](out_dir, dest)
        _copy(before, out_dir)
        if dest.endswith("whole"):
            whole = dest
            break
        cuts.append({"n": n, "dir": dest})
    else:
        raise RuntimeError("the save has more than %d write events" % max_cuts)
    events = {}
    with _real["open"](logpath) as f:
        for line in f:
            e = json.loads(line)
            events[e["n"]] = e["event"]
    for c in cuts:
        c["event"] = events.get(c["n"], "?")
    return cuts, whole


def _copy(src, dst):
    if os.path.lexists(dst):
        _real["rmtree"](dst)
    shutil.copytree(src, dst, symlinks=True)
