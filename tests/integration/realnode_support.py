"""Helpers for the real-node tests: kubectl as a coroutine, pod manifests on a given node, an OCI layout whose image
runs as root (derived from a built one: every image kanri builds runs as a non-root user), and what a module running
an operator's product needs: three nodes, CoreDNS, the local-path provisioner and the operator's image knob."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kanri.local.controlplane import Endpoint
from kanri.local.realnode import RealCluster
from kanri.local.realnode.addons import ClusterDNS, cluster_dns_ip, coredns_image, install_coredns
from kanri.local.realnode.addons.coredns import NAMESPACE as DNS_NAMESPACE
from kanri.local.realnode.addons.localpath import LocalPathProvisioner
from kanri.local.realnode.node import node_bin_dir
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


@contextlib.contextmanager
def three_real_nodes(
    control_plane: Endpoint,
    work_dir: Path,
    prefix: str,
    image: str,
    first_node_images: tuple[str, ...] = (),
    every_node_images: tuple[str, ...] = (),
) -> Iterator[RealCluster]:
    """Three real nodes in three zones on the session's control plane, holding ``image`` (also the provisioner's
    helper: it has a shell), ``every_node_images`` and CoreDNS's, their cluster DNS the Service range's tenth address;
    stopped, deregistered and checked for leftovers at the end."""
    config = json.loads((control_plane.kubeconfig.parent / "config.json").read_text())
    nodes = RealCluster(
        control_plane.kubeconfig.parent,
        work_dir / "nodes",
        prefix=prefix,
        images=(image, *every_node_images),
        first_node_images=first_node_images,
        extra_layouts=(coredns_image(node_bin_dir(), work_dir / "coredns"),),
        cluster_dns=cluster_dns_ip(config["serviceCIDR"]),
    )
    print(f"three real nodes: start -> Ready in {nodes.start()}")
    try:
        yield nodes
    finally:
        nodes.stop()
        nodes.deregister()
        assert nodes.leftovers() == []


@contextlib.contextmanager
def coredns_on(nodes: RealCluster) -> Iterator[ClusterDNS]:
    """CoreDNS for the nodes, removed at the end: the session's control plane outlives the module, and later tests
    (the home-made node's DNS) make their own kube-dns."""
    first = nodes.nodes[0]
    yield install_coredns(first.control_plane_dir, node_bin_dir())
    for kind in ("deployment/coredns", "service/kube-dns", "configmap/coredns"):
        subprocess.run(["kubectl", f"--kubeconfig={first.admin_kubeconfig}", "-n", DNS_NAMESPACE, "delete", kind],
                       check=True, capture_output=True)  # fmt: skip


@contextlib.contextmanager
def local_path_on(nodes: RealCluster, work_dir: Path, helper_image: str) -> Iterator[LocalPathProvisioner]:
    """The local-path provisioner for the nodes (volumes under ``work_dir/volumes/<node>``), its helper pods from
    ``helper_image``; stopped at the end."""
    first = nodes.nodes[0]
    paths = {node.spec.name: str(work_dir / "volumes" / node.spec.name) for node in nodes.nodes}
    local_path = LocalPathProvisioner(
        first.control_plane_dir, work_dir / "provisioner", node_bin_dir(), paths, first.image(helper_image).ref
    )
    local_path.start()
    try:
        yield local_path
    finally:
        local_path.stop()


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the block (an operator's image knob), then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
