"""``kanri up --real-nodes``: the main job on real Kubernetes nodes (kubelet, containerd, runc; docs/real-nodes.md)
instead of the home-made node.

What differs from the home-made node's ``kanri up``: the nodes run kanri's images as ``make images`` built them, so

1. the images the main job needs are imported into every node first (:data:`NEEDED`, plus the PostgreSQL image of
   the example's major): what a pull from a registry would bring, cheap when a node holds them already;
2. the manifests name them as the nodes know them, ``kanri.local/<built repository>:<tag>`` (:func:`node_image`),
   with ``imagePullPolicy: Never`` — a major that was not imported fails visibly (``ErrImageNeverPull`` in the
   pod's status and Events) instead of waiting on a registry nobody can reach;
3. claims with no class get the local-path provisioner's volumes (the cluster's default StorageClass), and the
   machine reaches the Service addresses through a node (``kanri psql`` uses the ClusterIP directly).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kanri.local import paths
from kanri.local.imagemap import BUILT_REPOSITORIES
from kanri.local.realnode import local as realnode_local
from kanri.local.realnode.images import IMAGE_REGISTRY
from kanri.postgres.children.images import ENV as POSTGRES_IMAGES_ENV

Obj = dict[str, Any]

NEEDED = ("kanri-operator", "kanri-seaweedfs")
"""Built images the main job runs besides its PostgreSQL major (the nodes start with the tools image only)."""


def node_image(image: str) -> str:
    """The name a real node knows a kanri image by: ``kanri.dev/kanri-postgres:15`` (or the local name
    ``kanri.dev/seaweedfs:4.48``) -> ``kanri.local/kanri-postgres:15`` (``kanri.local/kanri-seaweedfs:4.48``)."""
    name, _, tag = image.rpartition(":")
    repository = BUILT_REPOSITORIES.get(name) or name.rpartition("/")[2]
    return f"{IMAGE_REGISTRY}/{repository}:{tag}"


def images_for(example: Obj) -> tuple[str, ...]:
    """The built images to import for ``example`` (a PostgresCluster manifest)."""
    major = (example.get("spec") or {}).get("version")
    return (*NEEDED, *([f"kanri-postgres-{major}"] if major is not None else []))


def import_images(name: str, example: Obj) -> tuple[str, ...]:
    """Import what ``example`` needs into every running node of local cluster ``name``; the images' names."""
    needed = images_for(example)
    realnode_local.import_images(paths.cluster_dir(name), needed)
    return needed


def on_real_nodes(docs: list[Obj]) -> list[Obj]:
    """``docs`` with every container image (and the operator's table of PostgreSQL images) named as the nodes know
    it, never pulled."""
    changed = copy.deepcopy(docs)
    for doc in changed:
        pod = _pod_spec(doc)
        if pod is None:
            continue
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            container["image"] = node_image(container["image"])
            container["imagePullPolicy"] = "Never"
            for env in container.get("env", []):
                if env.get("name") == POSTGRES_IMAGES_ENV and "value" in env:
                    table = json.loads(env["value"])
                    renamed = {kind: {major: node_image(image) for major, image in by_major.items()}
                               for kind, by_major in table.items()}  # fmt: skip
                    env["value"] = json.dumps(renamed, separators=(",", ":"))
    return changed


def _pod_spec(doc: Obj) -> Obj | None:
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec: Obj = doc["spec"]["template"]["spec"]
        return spec
    return None
