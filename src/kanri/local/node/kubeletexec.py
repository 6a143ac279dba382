"""``kubectl exec`` on a node: the kubelet's ``/exec`` over WebSocket (the ``v5.channel.k8s.io`` protocol).

Since v1.36 the API server (``ExtendWebSocketsToKubelet``, on by default) passes a WebSocket exec request straight to
a kubelet whose Node lists that feature in ``status.declaredFeatures`` (ours does), instead of translating it to SPDY
— so a node that speaks the WebSocket channel protocol needs no SPDY at all. The protocol
(``k8s.io/streaming/pkg/httpstream/wsstream``, ``client-go/tools/remotecommand/websocket.go``): every message is
binary, its first byte the channel — 0 stdin, 1 stdout, 2 stderr, 3 error (one ``metav1.Status`` in JSON at the end),
4 terminal resize (``{"Width": w, "Height": h}``); ``[255, n]`` closes channel ``n`` (v5; the client closes stdin so).
The command runs as an exec probe does: ``nsenter`` into the container's namespaces and root, as its user, in its
working directory, with its init's environment. With ``tty`` it gets a pseudo-terminal (stdout carries both
streams, as with a real one).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import shutil
import signal
import struct
import termios
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import WSMessage, WSMsgType, web

log = structlog.get_logger("kanri.local.kubeletexec")

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
_CHUNK = 32 * 1024
_TRUE = ("1", "true", "True", "TRUE", "t", "T")
# kubectl sends the caller's terminal size just after the stream opens; a command started before it arrives (``stty
# size``, a shell laying out its prompt) would see 0x0. A terminal exec waits this long for that first message.
FIRST_SIZE_WAIT = 1.0


@dataclass(frozen=True)
class ExecRequest:
    """What ``/exec`` was asked for (``PodExecOptions`` as query parameters)."""

    command: list[str]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool

    @classmethod
    def from_query(cls, query: Mapping[str, str], command: list[str]) -> ExecRequest:
        def flag(name: str) -> bool:
            return query.get(name, "") in _TRUE

        return cls(command, flag("input"), flag("output"), flag("error"), flag("tty"))


@dataclass(frozen=True)
class ContainerProcess:
    """Where to run: the container init's host pid, and the user it runs as."""

    pid: int
    uid: int | None
    gid: int | None


def exit_status(code: int) -> dict[str, Any]:
    """The error channel's last word, as the kubelet's stream translator writes it."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def nsenter_argv(target: ContainerProcess, command: list[str]) -> list[str]:
    nsenter = shutil.which("nsenter") or "nsenter"
    argv = [nsenter, f"--target={target.pid}", "--net", "--mount", "--uts", "--ipc", "--pid", "--root", "--wd"]
    if target.uid is not None:
        argv += [f"--setuid={target.uid}", f"--setgid={target.gid or 0}"]
    return [*argv, "--", *command]


def container_environment(pid: int) -> dict[str, str]:
    """The container init's environment as it was started (``/proc/<pid>/environ``)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read()
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


async def serve_exec(request: web.Request, exec_request: ExecRequest, target: ContainerProcess) -> web.StreamResponse:
    """Upgrade to WebSocket, run the command, relay its streams, send its exit status, close."""
    ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
    if not ws.can_prepare(request).ok:
        return web.Response(
            status=400,
            text="the kanri local node serves exec over WebSocket (v5.channel.k8s.io) only, not SPDY",
        )
    await ws.prepare(request)
    try:
        code = await _run(ws, exec_request, target)
        await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(code)).encode())
    except (OSError, ConnectionResetError) as exc:
        with contextlib.suppress(ConnectionResetError):
            status = {"metadata": {}, "status": "Failure", "message": str(exc), "reason": "InternalError"}
            await ws.send_bytes(bytes([ERROR]) + json.dumps(status).encode())
    finally:
        await ws.close()
    return ws


async def _run(ws: web.WebSocketResponse, exec_request: ExecRequest, target: ContainerProcess) -> int:
    env = await asyncio.to_thread(container_environment, target.pid)
    argv = nsenter_argv(target, exec_request.command)
    terminal: Terminal | None = None
    if exec_request.tty:
        terminal = Terminal()
        stdio: dict[str, Any] = {"stdin": terminal.slave, "stdout": terminal.slave, "stderr": terminal.slave}
    else:
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        stdio = {
            "stdin": pipe if exec_request.stdin else devnull,
            "stdout": pipe if exec_request.stdout else devnull,
            "stderr": pipe if exec_request.stderr else devnull,
        }
    try:
        early: list[WSMessage] = []
        if terminal is not None:
            early = await _first_size(ws, terminal)
            stdio["preexec_fn"] = _take_terminal  # in the child, after its setsid
        process = await asyncio.create_subprocess_exec(*argv, env=env, start_new_session=True, **stdio)
        outputs: list[tuple[asyncio.StreamReader | None, int]]
        if terminal is not None:
            outputs = [(await terminal.opened(), STDOUT)]  # the child holds the terminal now
        else:
            outputs = [(process.stdout, STDOUT), (process.stderr, STDERR)]
        pumps = [asyncio.create_task(_pump(stream, ws, channel)) for stream, channel in outputs if stream is not None]
        inbound = asyncio.create_task(_receive(ws, process, terminal, early))
        try:
            code = await process.wait()
            await asyncio.gather(*pumps, return_exceptions=True)  # what it wrote before it ended
        finally:
            inbound.cancel()
            for task in pumps:
                task.cancel()
            if process.returncode is None:  # the client left (we were cancelled): the command goes too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                await asyncio.shield(process.wait())
        return code if code >= 0 else 128 - code
    finally:
        if terminal is not None:
            terminal.close()


def _take_terminal() -> None:
    """Make the pseudo-terminal (stdin) the new session's controlling terminal: ^C and job control then work."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A pseudo-terminal for ``tty`` execs: the child gets the slave side; we read and write the master."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self._transport: asyncio.ReadTransport | None = None

    async def opened(self) -> asyncio.StreamReader:
        """The master's output as a stream (its read fails with EIO once no process holds the terminal)."""
        os.close(self.slave)
        self.slave = -1
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        reading = os.fdopen(os.dup(self.master), "rb", buffering=0)
        self._transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), reading)
        return reader

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:  # the descriptor is shared with the non-blocking reader
                await asyncio.sleep(0.01)

    def resize(self, width: int, height: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        for fd in (self.master, self.slave):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


async def _pump(stream: asyncio.StreamReader, ws: web.WebSocketResponse, channel: int) -> None:
    with contextlib.suppress(OSError):  # EIO: a terminal whose last process is gone
        while chunk := await stream.read(_CHUNK):
            await ws.send_bytes(bytes([channel]) + chunk)


async def _first_size(ws: web.WebSocketResponse, terminal: Terminal) -> list[WSMessage]:
    """Wait (briefly) for the client's first terminal size and apply it; any other early message is kept for later."""
    try:
        message = await ws.receive(timeout=FIRST_SIZE_WAIT)
    except TimeoutError:
        return []
    data = message.data if message.type == WSMsgType.BINARY else b""
    if data[:1] == bytes([RESIZE]):
        _apply_size(terminal, data[1:])
        return []
    return [message]


def _apply_size(terminal: Terminal, payload: bytes) -> None:
    with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
        size = json.loads(payload)
        terminal.resize(int(size["Width"]), int(size["Height"]))


async def _receive(
    ws: web.WebSocketResponse,
    process: asyncio.subprocess.Process,
    terminal: Terminal | None,
    early: list[WSMessage],
) -> None:
    """The client's messages: stdin, its close, terminal sizes. The socket closing kills the command."""
    for message in early:
        if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            break
        await _handle(message, process, terminal)
    else:
        async for message in ws:
            await _handle(message, process, terminal)
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


async def _handle(message: WSMessage, process: asyncio.subprocess.Process, terminal: Terminal | None) -> None:
    if message.type != WSMsgType.BINARY or not message.data:
        return
    data: bytes = message.data
    channel, payload = data[0], data[1:]
    if channel == STDIN and payload:
        if terminal is not None:
            await terminal.write(payload)
        elif process.stdin is not None:
            process.stdin.write(payload)
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                await process.stdin.drain()
    elif channel == CLOSE and payload[:1] == bytes([STDIN]):
        if terminal is not None:
            await terminal.write(b"\x04")  # end of input, as a terminal spells it
        elif process.stdin is not None:
            process.stdin.close()
    elif channel == RESIZE and terminal is not None:
        _apply_size(terminal, payload)
