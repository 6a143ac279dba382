"""Secrets stay secret: every Secret value an e2e test's namespace ever held is searched for in what it left behind.

A :class:`SecretScan` watches the namespace's Secrets for the whole test (a cluster deleted with ``Delete`` takes its
Secrets along before the test ends) and remembers every value worth hiding: passwords, tokens, private keys — not
usernames, not certificates, nothing shorter than 8 characters. When the test ends, before its namespace goes, it
searches:

- the namespace's Events, ConfigMaps, PostgresClusters (spec and status), Pods and StatefulSets, as JSON (pod env
  ``valueFrom`` references name a Secret and a key, never a value);
- every container log the local nodes wrote under the test's tmp_path (``pods/<ns>_<pod>_<uid>/<container>/*.log``);
- the test's own output and log records (the in-process operator logs there);
- the argument lists of every process still running on the machine.

A hit fails the test with where the value was found and which Secret key it belongs to; the value is never printed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, Kind
from kanri.runtime.kinds import CONFIG_MAP, EVENT, POD, SECRET, STATEFUL_SET

__all__ = ["SecretScan"]

MIN_LENGTH = 8
# Keys whose values are public by design: who connects, and certificates (the CA is published on purpose).
PUBLIC_KEYS = {"username", "user", "ca.crt", "tls.crt"}
SCANNED: tuple[Kind, ...] = (EVENT, CONFIG_MAP, POSTGRES_CLUSTER, POD, STATEFUL_SET)


def sensitive_values(key: str, value: str) -> list[str]:
    """What of one Secret value must never appear elsewhere: the value, or each body line of a PEM key."""
    if key in PUBLIC_KEYS or key.endswith(".crt") or len(value) < MIN_LENGTH:
        return []
    if "-----BEGIN" in value:
        return [line for line in value.splitlines() if len(line) >= 16 and not line.startswith("-----")]
    return [value]


@dataclass
class SecretScan:
    """Remembers a namespace's Secret values while a test runs, then looks for them where they must not be."""

    client: Client
    namespace: str
    values: dict[str, str] = field(default_factory=dict)
    """Sensitive value → ``secret/<name>:<key>`` (where it came from; the value itself is never shown)."""
    _task: asyncio.Task[None] | None = None

    def remember(self, secret: dict[str, object]) -> None:
        meta = secret.get("metadata") or {}
        name = meta.get("name", "?") if isinstance(meta, dict) else "?"
        data = secret.get("data") or {}
        if not isinstance(data, dict):
            return
        if secret.get("type") == "kubernetes.io/service-account-token":
            return  # the API server's own tokens, not kanri's
        for key, encoded in data.items():
            try:
                value = base64.b64decode(str(encoded)).decode()
            except (UnicodeDecodeError, ValueError):
                continue  # binary: cannot show up in text
            for piece in sensitive_values(key, value):
                self.values[piece] = f"secret/{name}:{key}"

    async def start(self) -> None:
        """Read the current Secrets, then follow every change until :meth:`stop`."""
        items, version = await self.client.list(SECRET, self.namespace)
        for secret in items:
            self.remember(secret)
        self._task = asyncio.create_task(self._follow(version))

    async def _follow(self, version: str) -> None:
        while True:
            try:
                async for event in self.client.watch(SECRET, self.namespace, resource_version=version):
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.remember(obj)
            except (ApiError, TimeoutError, OSError):
                # Relist: a gap in the watch must not hide a Secret that came and went.
                with contextlib.suppress(ApiError, OSError):
                    items, version = await self.client.list(SECRET, self.namespace)
                    for secret in items:
                        self.remember(secret)
                await asyncio.sleep(0.5)  # not a wait for a condition: just no hot loop against a failing server

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # A last list, in case a Secret was created after the watch's last event arrived.
        with contextlib.suppress(ApiError):
            for secret in (await self.client.list(SECRET, self.namespace))[0]:
                self.remember(secret)

    def find(self, where: str, text: str) -> list[str]:
        """The places (never the values) where ``text`` from ``where`` holds a remembered value."""
        return [f"{origin} found in {where}" for value, origin in self.values.items() if value in text]

    async def findings(self, log_root: Path, output: Iterable[tuple[str, str]]) -> list[str]:
        """Search objects, container logs under ``log_root``, ``output`` ((where, text) pairs) and process argv."""
        if not self.values:
            return []
        found: list[str] = []
        for kind in SCANNED:
            with contextlib.suppress(ApiError):  # a CRD not installed in this test
                for obj in (await self.client.list(kind, self.namespace))[0]:
                    where = f"{kind.kind} {obj['metadata']['name']}"
                    found += self.find(where, json.dumps(obj))
        # Off the event loop: the local node's kubelet runs on it.
        for where, text in [*await asyncio.to_thread(_files, log_root), *output]:
            found += self.find(where, text)
        return found


def _container_logs(log_root: Path) -> list[tuple[str, str]]:
    """(where, text) of every container log (``…/pods/<pod>/<container>/<n>.log``) under ``log_root``. The node may
    still be removing a volume or a pod's directory while this walks (a deleted cluster's data): what vanished
    meanwhile is skipped (os.walk ignores a directory it can no longer list), never an error."""
    texts: list[tuple[str, str]] = []
    for directory, _, files in os.walk(log_root):
        here = Path(directory)
        if here.parent.parent.name != "pods":
            continue
        for name in files:
            if name.endswith(".log"):
                with contextlib.suppress(OSError):
                    texts.append((str((here / name).relative_to(log_root)), (here / name).read_text(errors="replace")))
    return texts


def _files(log_root: Path) -> list[tuple[str, str]]:
    """(where, text) of every container log under ``log_root`` and every running process's argv."""
    texts = _container_logs(log_root)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            texts.append(
                (
                    f"the argv of pid {cmdline.parent.name}",
                    cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"),
                )
            )
    return texts
