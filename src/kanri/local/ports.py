"""Free TCP ports for local servers, without the race of "bind to 0, close, hand the number on".

A port found by binding to 0 lies in the kernel's ephemeral range (32768-60999 by default): between the probe's
close and the server's own bind, any process's outgoing connection or its own bind to 0 may take it — on a busy
machine running two test processes at once, with thousands of connections a minute, that is a rare but real
failure. With ``KANRI_PORT_RANGE=LOW-HIGH`` ports come from that range instead: below the ephemeral range (so the
kernel never picks them for a connection) and, in ``make test``, a different range for each pytest process
(hack/test.sh), so no other process hands them out. Within one process they are handed out in turn, each checked
free by a bind, starting at an offset derived from the process id (a child process inheriting the range starts
elsewhere in it). Without the variable: the kernel's choice, as before.
"""

from __future__ import annotations

import os
import socket
import threading

__all__ = ["PORT_RANGE_ENV", "free_port", "port_range"]

PORT_RANGE_ENV = "KANRI_PORT_RANGE"
"""``LOW-HIGH`` (inclusive): where :func:`free_port` takes ports from; unset or empty: the kernel's choice."""

_lock = threading.Lock()
_cursor: dict[tuple[int, int], int] = {}


def port_range(value: str | None = None) -> tuple[int, int] | None:
    """``KANRI_PORT_RANGE`` (or ``value``) parsed; None when unset. A malformed range is refused naming it."""
    text = os.environ.get(PORT_RANGE_ENV, "") if value is None else value
    if not text.strip():
        return None
    low_text, sep, high_text = text.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low, high = 0, -1
    if not sep or not 1024 <= low <= high <= 65535:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH with 1024 <= LOW <= HIGH <= 65535")
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on or holds now (see the module docstring for where from)."""
    span = port_range()
    if span is None:
        return _kernels_choice(host)
    low, high = span
    size = high - low + 1
    with _lock:
        offset = _cursor.get(span, (os.getpid() * 7919) % size)
        for step in range(size):
            port = low + (offset + step) % size
            if _bindable(host, port):
                _cursor[span] = (offset + step + 1) % size
                return port
    raise OSError(f"no free port in {PORT_RANGE_ENV}={low}-{high} on {host}")


def _kernels_choice(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True
