"""How the local node is set up: one frozen value, handed to every part."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class NodeOptions:
    """Settings of the local node. Only ``data_dir`` is required."""

    data_dir: Path
    """Root of the node's state; volumes live in ``<data_dir>/volumes/<pv-name>``."""
    name: str = "kanri-local"
    """The Node object's name (and ``kubernetes.io/hostname`` label)."""
    internal_ip: str = "10.244.0.1"
    """The Node's ``InternalIP``: the pod network's gateway. Never a loopback address — EndpointSlices and some
    clients refuse those."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra node labels, on top of ``kubernetes.io/hostname``/``os``/``arch``."""
    max_pods: int = 110
    """``pods`` capacity, the kubelet's default."""
    heartbeat_interval: float = 10.0
    """How often the Ready condition's ``lastHeartbeatTime`` and the node Lease are renewed (the kubelet's
    ``nodeStatusUpdateFrequency`` and lease renew interval)."""
    lease_duration_seconds: int = 40
    """The node Lease's ``leaseDurationSeconds`` (the kubelet's ``nodeLeaseDurationSeconds``)."""
    scheduler_name: str = "default-scheduler"
    """Pods naming this ``schedulerName`` (or none) are scheduled here."""
    storage_class: str = "kanri-local"
    """Name of the StorageClass the node creates for its provisioner."""
    default_storage_class: bool = True
    """Mark that StorageClass as the cluster's default (PVCs without a class get it)."""

    @property
    def volumes_dir(self) -> Path:
        return self.data_dir / "volumes"
