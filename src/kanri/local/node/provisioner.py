"""Local volumes: a default StorageClass, a provisioner that makes one directory per PersistentVolume, reclaim, and
expansion.

The split of work with kube-controller-manager, which is what a real external provisioner does:

1. A PVC of a class whose provisioner is ``kanri.dev/local`` stays Pending. The class binds
   ``WaitForFirstConsumer``: the scheduler picks a node for the first pod using the claim and annotates the claim
   ``volume.kubernetes.io/selected-node: <node>``; the PV binder in the controller-manager then annotates it
   (``volume.kubernetes.io/storage-provisioner``) and waits for us.
2. The :class:`VolumeProvisioner` of the selected node (each node runs one; the others leave the claim alone)
   creates ``<data_dir>/volumes/pvc-<claim uid>`` and a ``local`` PersistentVolume with
   node affinity for our node, capacity = the request, and a ``claimRef`` to the claim. The binder sees a PV
   pre-bound to the claim and binds both (PV ``Bound``, PVC ``spec.volumeName`` and ``Bound`` with the capacity).
3. When the claim is deleted the binder marks the PV ``Released``. For ``Delete`` it leaves the deletion to the
   provisioner named in ``pv.kubernetes.io/provisioned-by``: :class:`VolumeReclaimer` removes the directory, then
   the PV. ``Retain`` keeps both, as the class said.
4. Expansion: the expand controller finds no in-tree plugin able to expand a ``local`` volume, emits
   ``ExternalExpanding`` ("waiting for an external controller to expand this PVC") and leaves it to us, as it does
   for CSI drivers and their external-resizer. A directory has no size to grow, so the resize is the API dance
   only: the PV's ``spec.capacity`` is raised, then the PVC's ``status.capacity`` and ``status.allocatedResources``
   are set to the new size (no node-side step: nothing to grow in a filesystem). That is what ``kubectl get pvc``
   shows as CAPACITY.
5. Capacity: a directory has no size of its own, so the only honest limit is the filesystem under the volume dir.
   A claim (or a growth) larger than its free space is refused with a Warning Event (``ProvisioningFailed``,
   ``VolumeResizeFailed``) naming requested and available, and retried later, as a real provisioner does; space is
   not reserved, so claims that each fit may still together overcommit the disk (as with other local provisioners).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import structlog

from kanri.local.node.kinds import PERSISTENT_VOLUME, STORAGE_CLASS
from kanri.local.node.options import NodeOptions
from kanri.local.node.state import NodeEvents, NodeState
from kanri.runtime import ApiError, Cache, Client, Controller, EventRecorder, Request, Result, parse_quantity
from kanri.runtime.kinds import PVC

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.provisioner")

PROVISIONER = "kanri.dev/local"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
ANN_NODE = "kanri.dev/node"
"""On our PVs: the local node whose disk holds the directory (each node reclaims only its own)."""
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""Set by the scheduler on a WaitForFirstConsumer claim: the node its first pod was placed on."""
_FIELD_MANAGER = "kanri-local-node"
_RESIZE_CONDITIONS = ("Resizing", "FileSystemResizePending", "ControllerResizeError", "NodeResizeError")
RETRY_FULL_SECONDS = 60.0
"""How soon a claim refused for lack of space is looked at again (space may have been freed)."""
_BINARY_UNITS = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")


# --- objects ---------------------------------------------------------------------------------------------------------


def storage_class(
    name: str, *, default: bool, reclaim_policy: str = "Delete", allow_volume_expansion: bool = True
) -> Obj:
    """A StorageClass served by the local provisioner.

    ``WaitForFirstConsumer`` binding: a local volume lives on one node's disk, so it is made only once the scheduler
    has placed the claim's first pod (taking the pod's other constraints into account) and named that node.
    """
    annotations = {ANN_DEFAULT_CLASS: "true"} if default else {}
    return {
        "apiVersion": STORAGE_CLASS.api_version,
        "kind": STORAGE_CLASS.kind,
        "metadata": {"name": name, "annotations": annotations},
        "provisioner": PROVISIONER,
        "reclaimPolicy": reclaim_policy,
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": allow_volume_expansion,
    }


def provisioned_here(claim: Obj, storage_class: Obj, node: str, *, serves_immediate: bool) -> bool:
    """Whether ``node``'s provisioner makes ``claim``'s volume: the node the scheduler chose (``selected-node``);
    a claim of an ``Immediate`` class (a user's) with no node chosen goes to the node that ``serves_immediate``
    (a host's first)."""
    chosen = (claim["metadata"].get("annotations") or {}).get(ANN_SELECTED_NODE)
    if chosen:
        return bool(chosen == node)
    return serves_immediate and storage_class.get("volumeBindingMode", "Immediate") == "Immediate"


def volume_name(claim: Obj) -> str:
    """``pvc-<claim uid>``, as external provisioners name theirs: one claim, one name, so a retry is idempotent."""
    return f"pvc-{claim['metadata']['uid']}"


def unsupported(claim: Obj) -> str | None:
    """Why a directory cannot serve ``claim``, or None."""
    spec = claim.get("spec") or {}
    if spec.get("volumeMode") == "Block":
        return "block volumes are not supported by the kanri local provisioner (only Filesystem)"
    if spec.get("selector"):
        return "claim selectors are not supported by dynamic provisioning"
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        return "volume data sources (clones, snapshots, populators) are not supported by the kanri local provisioner"
    if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
        return "the claim requests no storage size"
    return None


def persistent_volume(claim: Obj, storage_class: Obj, node_name: str, path: Path) -> Obj:
    """The PV for ``claim``: a ``local`` volume at ``path``, only on ``node_name``, pre-bound to the claim."""
    meta, spec = claim["metadata"], claim["spec"]
    pv_spec: Obj = {
        "capacity": {"storage": spec["resources"]["requests"]["storage"]},
        "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
        "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
        "storageClassName": storage_class["metadata"]["name"],
        "volumeMode": "Filesystem",
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "local": {"path": str(path)},
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}
                ]
            }
        },
    }
    if storage_class.get("mountOptions"):
        pv_spec["mountOptions"] = list(storage_class["mountOptions"])
    return {
        "metadata": {
            "name": volume_name(claim),
            "annotations": {ANN_PROVISIONED_BY: PROVISIONER, ANN_NODE: node_name},
        },
        "spec": pv_spec,
    }


def needs_expansion(claim: Obj) -> bool:
    """A Bound claim asking for more than its status says it has."""
    requested = ((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    status = claim.get("status") or {}
    current = (status.get("capacity") or {}).get("storage")
    if status.get("phase") != "Bound" or requested is None or current is None:
        return False
    return parse_quantity(requested) > parse_quantity(current)


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged user may still write on the filesystem holding ``directory`` (or, before it exists,
    its nearest existing parent)."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def readable_bytes(count: int | Decimal) -> str:
    """``count`` bytes in the largest binary unit that keeps a whole number, rounded down (``75Gi``, ``512Mi``)."""
    for power, unit in zip(range(60, 0, -10), _BINARY_UNITS, strict=True):
        if count >= 1 << power:
            return f"{int(count) >> power}{unit}"
    return str(int(count))


def shortfall(requested: str, size: Decimal, available: int, directory: Path) -> str | None:
    """Why ``size`` bytes (described as ``requested``) do not fit into ``available`` free bytes, or None."""
    if size <= available:
        return None
    return f"requested {requested} but only {readable_bytes(available)} is available on the filesystem of {directory}"


async def ensure_storage_class(client: Client, options: NodeOptions) -> None:
    """Create (or re-assert) the node's StorageClass. Its fields are immutable: one that binds ``Immediate`` (what
    earlier kanri versions made) is replaced, any other difference is left alone (logged)."""
    desired = storage_class(options.storage_class, default=options.default_storage_class)
    try:
        await client.apply(STORAGE_CLASS, desired, field_manager=_FIELD_MANAGER)
    except ApiError as exc:
        if exc.status != 422:
            raise
        existing = await client.get(STORAGE_CLASS, options.storage_class)
        if existing.get("volumeBindingMode", "Immediate") != "Immediate" or existing.get("provisioner") != PROVISIONER:
            log.warning("storage class exists with other settings; left as it is", name=options.storage_class,
                        error=exc.message)  # fmt: skip
            return
        # Existing claims and volumes keep working: a class is only read when a claim is provisioned.
        await client.delete(STORAGE_CLASS, options.storage_class, uid=existing["metadata"]["uid"])
        await client.apply(STORAGE_CLASS, desired, field_manager=_FIELD_MANAGER)
        log.warning("storage class replaced: it bound Immediate, local volumes need WaitForFirstConsumer",
                    name=options.storage_class)  # fmt: skip


# --- controllers -----------------------------------------------------------------------------------------------------


class VolumeProvisioner:
    """Keyed by PVC: provisions a volume for a Pending claim of one of our classes; grows a Bound one."""

    def __init__(
        self,
        cache: Cache,
        client: Client,
        options: NodeOptions,
        state: NodeState | None = None,
        *,
        serves_immediate: bool = True,
    ) -> None:
        self._cache = cache
        self._client = client
        self.options = options
        self.serves_immediate = serves_immediate
        self._state = state or NodeState()
        self._events: EventRecorder = NodeEvents(client, self._state, component=PROVISIONER)

    def controller(self) -> Controller:
        return Controller(f"provisioner-{self.options.name}", self, for_kind=PVC).watches(STORAGE_CLASS, self._on_class)

    def _on_class(self, storage_class: Obj) -> list[Request]:
        name = storage_class["metadata"]["name"]
        return [
            Request(c["metadata"]["namespace"], c["metadata"]["name"])
            for c in self._cache.list(PVC)
            if (c.get("spec") or {}).get("storageClassName") == name
        ]

    def _our_class(self, claim: Obj) -> Obj | None:
        name = (claim.get("spec") or {}).get("storageClassName")
        storage_class = self._cache.get(STORAGE_CLASS, name) if name else None
        return storage_class if storage_class is not None and storage_class.get("provisioner") == PROVISIONER else None

    async def reconcile(self, request: Request) -> Result | None:
        await self._state.active()
        claim = self._cache.get(PVC, request.name, request.namespace)
        if claim is None or claim["metadata"].get("deletionTimestamp"):
            return None
        storage_class = self._our_class(claim)
        if storage_class is None:
            return None  # another provisioner's claim (or a static one)
        if not (claim.get("spec") or {}).get("volumeName"):
            here = provisioned_here(claim, storage_class, self.options.name, serves_immediate=self.serves_immediate)
            if not here:
                return None  # another node's, or not placed yet
            return await self._provision(claim, storage_class)
        if needs_expansion(claim):
            return await self._expand(claim)
        return None

    async def _no_room(self, requested: str, size: Decimal) -> str | None:
        """Why ``size`` more bytes do not fit under the volume dir, or None."""
        directory = self.options.volumes_dir.resolve()
        available = await asyncio.to_thread(free_bytes, directory)
        return shortfall(requested, size, available, directory)

    async def _provision(self, claim: Obj, storage_class: Obj) -> Result | None:
        problem = unsupported(claim)
        if problem is not None:
            await self._events.warning(claim, "ProvisioningFailed", problem)
            return None
        name = volume_name(claim)
        if self._cache.get(PERSISTENT_VOLUME, name) is not None:
            return None  # made already; the binder's turn
        size = claim["spec"]["resources"]["requests"]["storage"]
        full = await self._no_room(size, parse_quantity(size))
        if full is not None:
            # The claim stays Pending; a real provisioner keeps retrying too, as space may be freed.
            log.warning("claim does not fit", claim=_key(claim), problem=full)
            await self._events.warning(claim, "ProvisioningFailed", full)
            return Result(requeue_after=RETRY_FULL_SECONDS)
        path = self.options.volumes_dir.resolve() / name
        await asyncio.to_thread(_make_directory, path)
        volume = persistent_volume(claim, storage_class, self.options.name, path)
        try:
            await self._client.create(PERSISTENT_VOLUME, volume)
        except ApiError as exc:
            if not exc.conflict:
                raise
            return None  # an earlier attempt created it; its watch event had not arrived
        log.info("volume provisioned", claim=_key(claim), volume=name, path=str(path))
        await self._events.normal(claim, "ProvisioningSucceeded", f"Successfully provisioned volume {name}")
        return None

    async def _expand(self, claim: Obj) -> Result | None:
        volume = self._cache.get(PERSISTENT_VOLUME, claim["spec"]["volumeName"])
        if volume is None or not _ours(volume, self.options.name):
            return None
        size = claim["spec"]["resources"]["requests"]["storage"]
        meta = claim["metadata"]
        current = (volume["spec"].get("capacity") or {}).get("storage")
        growth = parse_quantity(size) - parse_quantity(current or 0)
        full = await self._no_room(f"{readable_bytes(growth)} more", growth) if growth > 0 else None
        if full is not None:
            await self._events.warning(claim, "VolumeResizeFailed", f"growing to {size}: {full}")
            return Result(requeue_after=RETRY_FULL_SECONDS)
        if current is None or parse_quantity(current) < parse_quantity(size):
            await self._client.patch(
                PERSISTENT_VOLUME, volume["metadata"]["name"], {"spec": {"capacity": {"storage": size}}}
            )
        # The directory needs no growing, so there is no node-side step: the claim is done at once.
        status = claim.get("status") or {}
        conditions = [c for c in status.get("conditions") or () if c.get("type") not in _RESIZE_CONDITIONS]
        patch = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {
                "capacity": {**(status.get("capacity") or {}), "storage": size},
                "allocatedResources": {**(status.get("allocatedResources") or {}), "storage": size},
                "allocatedResourceStatuses": None,
                "conditions": conditions or None,
            },
        }
        await self._client.patch_status(PVC, meta["name"], patch, meta["namespace"])
        log.info("volume expanded", claim=_key(claim), size=size)
        await self._events.normal(
            claim, "VolumeResizeSuccessful", f"resize volume {volume['metadata']['name']} to {size}"
        )
        return None


class VolumeReclaimer:
    """Keyed by PV: deletes the directory and the PV of a Released volume of ours whose policy is ``Delete``."""

    def __init__(self, cache: Cache, client: Client, options: NodeOptions, state: NodeState | None = None) -> None:
        self._cache = cache
        self._client = client
        self.options = options
        self._state = state or NodeState()

    def controller(self) -> Controller:
        return Controller(f"reclaimer-{self.options.name}", self, for_kind=PERSISTENT_VOLUME)

    async def reconcile(self, request: Request) -> Result | None:
        await self._state.active()
        volume = self._cache.get(PERSISTENT_VOLUME, request.name)
        if volume is None or volume["metadata"].get("deletionTimestamp") or not _ours(volume, self.options.name):
            return None
        spec = volume.get("spec") or {}
        released = (volume.get("status") or {}).get("phase") == "Released"
        if not released or spec.get("persistentVolumeReclaimPolicy") != "Delete":
            return None  # in use, or Retain: the data stays
        path = Path((spec.get("local") or {}).get("path") or "")
        if path.parent != self.options.volumes_dir.resolve() or path.name != request.name:
            # Never remove a directory we did not make, whatever a PV says.
            log.warning("not deleting a volume outside the node's volume dir", volume=request.name, path=str(path))
            return None
        await asyncio.to_thread(_remove_directory, path)
        meta = volume["metadata"]
        await self._client.delete(PERSISTENT_VOLUME, meta["name"], uid=meta["uid"])
        log.info("volume deleted", volume=meta["name"], path=str(path))
        return None


def _ours(volume: Obj, node_name: str) -> bool:
    annotations = volume["metadata"].get("annotations") or {}
    return annotations.get(ANN_PROVISIONED_BY) == PROVISIONER and annotations.get(ANN_NODE) == node_name


def _make_directory(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    # Writable by any user: the pod's processes run as their own non-root user (PostgreSQL refuses root), which
    # only the container slice will know. It may narrow this with the pod's fsGroup.
    os.chmod(path, 0o777)


def _remove_directory(path: Path) -> None:
    # Already gone when an earlier attempt removed it but then failed to delete the PV.
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def _key(obj: Obj) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
