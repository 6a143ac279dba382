"""Helpers for the real-node tests: kubectl as a coroutine, pod manifests on a given node, and an OCI layout whose
image runs as root (derived from a built one: every image kanri builds runs as a non-root user)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from tests.support import eventually


async def kubectl(kubeconfig: Path, *args: str, check: bool = True, stdin: dict[str, Any] | None = None) -> str:
    """Run kubectl against ``kubeconfig`` (``stdin``: a manifest for ``-f -``); its stdout (stderr appended when it
    fails and not ``check``)."""
    process = await asyncio.create_subprocess_exec(
        "kubectl", f"--kubeconfig={kubeconfig}", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate(json.dumps(stdin).encode() if stdin is not None else b"")
    if check and process.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {err.decode().strip()}")
    return out.decode() + ("" if process.returncode == 0 else err.decode())


def pod(
    name: str,
    node: str,
    image: str,
    command: list[str],
    *,
    restart: str = "Never",
    container: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A one-container pod bound to ``node`` (no scheduler involved) running ``command`` from a local image."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "Default",  # no cluster DNS on a real node yet
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command, **(container or {})}
            ],
        },
    }


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _write_blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(layout, digest).unlink(missing_ok=True)  # never write through a hard link to the source layout
    _blob(layout, digest).write_bytes(data)
    return digest, len(data)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def root_variant(source: Path, target: Path) -> None:
    """Copy the OCI layout ``source`` to ``target`` (blobs hard-linked) with its tagged image's user set to root.

    Only the tagged image manifest is kept (not the SBOM or signature: their subject is the original image)."""
    shutil.copytree(source, target, copy_function=_link_or_copy)
    index = json.loads((target / "index.json").read_text())
    entry = next(m for m in index["manifests"] if "org.opencontainers.image.ref.name" in m.get("annotations", {}))
    manifest = json.loads(_blob(target, entry["digest"]).read_bytes())
    config = json.loads(_blob(target, manifest["config"]["digest"]).read_bytes())
    config["config"]["User"] = "0:0"
    digest, size = _write_blob(target, json.dumps(config).encode())
    manifest["config"].update(digest=digest, size=size)
    digest, size = _write_blob(target, json.dumps(manifest).encode())
    entry.update(digest=digest, size=size)
    index["manifests"] = [entry]
    (target / "index.json").unlink()  # a hard link to the source's: writing through it would change the source
    (target / "index.json").write_text(json.dumps(index))


async def http_get(port: int, path: str, timeout: float = 30) -> bytes:
    """The response to ``GET path`` from 127.0.0.1:``port`` (a port-forward), asked until one says 200 OK."""

    async def fetched() -> bytes | None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return None
        writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        response = await reader.read()
        writer.close()
        return response if b"200 OK" in response else None

    return await eventually(fetched, timeout=timeout)
