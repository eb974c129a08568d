#!/usr/bin/env python3
"""Drive a command on a real pseudo-terminal, as a user at a terminal would.

usage: ptydrive.py ROWS COLS STEPS_JSON COMMAND [ARG...]

The command runs on a new pseudo-terminal (Python's pty module) of ROWS x COLS, as its
session's leader with the terminal as its controlling one. STEPS_JSON is a list of steps,
done in order:
  {"expect": REGEX}                      wait until the output since the last match matches
  {"send": TEXT}                         type TEXT
  {"resize": [ROWS, COLS]}               set the terminal's size (its foreground group gets SIGWINCH)
  {"signal": N}                          send signal N to the command
  {"poll": TEXT, "expect": REGEX}        type TEXT every half second until REGEX matches
Each wait gives up after 90 s. Then it waits for the command to exit and prints one JSON
object: {"exit": CODE (128+N for signal N), "output": everything the terminal showed,
"failed": the step that timed out, or ""}.
"""
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import fcntl
import time

WAIT = 90.0


def main():
    rows, cols, steps = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    argv = sys.argv[4:]
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    out = bytearray()
    mark = 0  # where the next expect starts looking

    def read(timeout):
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            return True
        try:
            data = os.read(fd, 65536)
        except OSError:
            return False
        if not data:
            return False
        out.extend(data)
        return True

    def wait_for(pattern, poll=None):
        nonlocal mark
        rx = re.compile(pattern.encode())
        deadline = time.monotonic() + WAIT
        next_poll = 0.0
        while time.monotonic() < deadline:
            if poll is not None and time.monotonic() >= next_poll:
                os.write(fd, poll.encode())
                next_poll = time.monotonic() + 0.5
            m = rx.search(out, mark)
            if m:
                mark = m.end()
                return True
            if not read(0.1):
                m = rx.search(out, mark)
                if m:
                    mark = m.end()
                    return True
                return False
        return False

    failed = ""
    for step in steps:
        if "expect" in step:
            if not wait_for(step["expect"], step.get("poll")):
                failed = json.dumps(step)
                break
        elif "send" in step:
            os.write(fd, step["send"].encode())
        elif "resize" in step:
            r, c = step["resize"]
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", r, c, 0, 0))
        elif "signal" in step:
            os.kill(pid, step["signal"])
    if failed:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    status = None
    while status is None and time.monotonic() < deadline:
        got, st = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            status = st
            break
        read(0.1)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        failed = failed or "the command did not exit"
    while read(0.2):  # what is left
        if not select.select([fd], [], [], 0)[0]:
            break
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    print(json.dumps({"exit": code, "output": out.decode("utf-8", "replace"), "failed": failed}))


if __name__ == "__main__":
    main()
