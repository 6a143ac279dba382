"""Container logs as a kubelet serves them: which run's file, the query's options, and reading (tail, limit, follow).

The node writes each run of a container to its own file, ``<restarts>.log`` (see
:func:`kanri.local.node.kubelet.log_path`), stdout and stderr interleaved, with no per-line times. The choice of file
follows the kubelet's ``validateContainerLogStatus`` (``pkg/kubelet/kubelet_pods.go``) and its error texts; the
query follows ``v1.PodLogOptions`` as ``GET /containerLogs/{namespace}/{pod}/{container}`` decodes and validates it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

Obj = dict[str, Any]

_CHUNK = 64 * 1024
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool, which the kubelet's decoder uses
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class LogError(Exception):
    """A request the kubelet refuses: ``status`` is its HTTP status, the message its body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogOptions:
    """The query of a log request (the subset of ``v1.PodLogOptions`` the node serves)."""

    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None


def parse_options(query: Mapping[str, str]) -> LogOptions:
    """Decode and validate the query like the kubelet: undecodable → 400, invalid → 422 (its bodies). Times are
    refused with 400: the node's log files carry none (``timestamps``, ``sinceSeconds``, ``sinceTime``)."""
    values = dict(query)
    tail = values.pop("tail", None)  # the kubelet's backwards-compatible spelling; "all" means no limit
    if tail is not None and tail != "all":
        values["tailLines"] = tail
    try:
        follow = _bool(values.get("follow"))
        previous = _bool(values.get("previous"))
        timestamps = _bool(values.get("timestamps"))
        tail_lines = _int(values.get("tailLines"))
        limit_bytes = _int(values.get("limitBytes"))
        since_seconds = _int(values.get("sinceSeconds"))
    except ValueError as exc:
        raise LogError(400, '{"message": "Unable to decode query."}') from exc
    if (
        (tail_lines is not None and tail_lines < 0)
        or (limit_bytes is not None and limit_bytes < 1)
        or (since_seconds is not None and since_seconds < 1)
        or (since_seconds is not None and values.get("sinceTime"))
    ):
        raise LogError(422, '{"message": "Invalid request."}')
    stream = values.get("stream")
    if stream is not None and stream != "All":
        # Also the kubelet's answer while its PodLogsQuerySplitStreams gate is off (the default in v1.37).
        raise LogError(400, f'unable to return the given log stream: "{stream}"')
    if timestamps or since_seconds is not None or values.get("sinceTime"):
        raise LogError(
            400,
            "the kanri local node keeps container logs without per-line times: timestamps, sinceSeconds and "
            "sinceTime are not supported",
        )
    return LogOptions(follow=follow, previous=previous, tail_lines=tail_lines, limit_bytes=limit_bytes)


def _bool(value: str | None) -> bool:
    if value is None or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise ValueError(value)


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)


def log_run(status: Obj | None, pod: str, container: str, previous: bool) -> int:
    """Which run's file (its restart count) holds the log asked for, from the container's ``containerStatuses``
    entry. A running container's current run is preferred; while a crashed one waits to restart, its last run is
    both the current and the previous log. Raises :class:`LogError` (400) with the kubelet's messages."""
    if status is None:
        raise LogError(400, f'container "{container}" in pod "{pod}" is not available')
    restarts = int(status.get("restartCount") or 0)
    state = status.get("state") or {}
    last_terminated = (status.get("lastState") or {}).get("terminated")
    # The node increments restartCount when a new run starts: until then the last run's file is <restartCount>.
    last_run = restarts if "waiting" in state else restarts - 1
    if previous:
        if last_terminated is None or last_run < 0:
            raise LogError(400, f'previous terminated container "{container}" in pod "{pod}" not found')
        return last_run
    if "running" in state or "terminated" in state:
        return restarts
    if last_terminated is not None:
        return last_run
    reason = (state.get("waiting") or {}).get("reason")
    if reason:
        raise LogError(400, f'container "{container}" in pod "{pod}" is waiting to start: {reason}')
    raise LogError(400, f'container "{container}" in pod "{pod}" is waiting to start - no logs yet')


def tail_offset(f: BinaryIO, lines: int) -> int:
    """Where the last ``lines`` lines of ``f`` start (a last line without its newline counts), reading backwards
    in blocks so a large log costs only its tail."""
    end = f.seek(0, os.SEEK_END)
    if lines == 0:
        return end
    position, wanted = end, lines
    skip_final_newline = True
    while position > 0:
        size = min(_CHUNK, position)
        position -= size
        f.seek(position)
        block = f.read(size)
        index = len(block)
        if skip_final_newline:
            skip_final_newline = False
            if block.endswith(b"\n"):
                index -= 1
        while (index := block.rfind(b"\n", 0, index)) != -1:
            wanted -= 1
            if wanted == 0:
                return position + index + 1
    return 0


async def read_log(
    path: Path,
    options: LogOptions,
    *,
    running: Callable[[], bool],
    poll_interval: float = 0.2,
) -> AsyncIterator[bytes]:
    """The log's chunks: from the start or the last ``tail_lines`` lines, at most ``limit_bytes`` in all. With
    ``follow``, keep reading what the container writes while ``running()`` holds (checked between polls), then
    what it wrote last, and end."""
    remaining = options.limit_bytes
    with path.open("rb") as f:
        f.seek(tail_offset(f, options.tail_lines) if options.tail_lines is not None else 0)
        while remaining is None or remaining > 0:
            # Asked before reading, so nothing written before the container ended is missed.
            still_running = options.follow and running()
            chunk = f.read(_CHUNK if remaining is None else min(_CHUNK, remaining))
            if chunk:
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk
                continue
            if not still_running:
                return
            await asyncio.sleep(poll_interval)
