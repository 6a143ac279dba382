"""Kinds the local node touches that :mod:`kanri.runtime.kinds` does not list (yet)."""

from __future__ import annotations

from kanri.runtime import Kind

NODE = Kind("v1", "Node", "nodes", namespaced=False)
PERSISTENT_VOLUME = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
STORAGE_CLASS = Kind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False)

NODE_LEASE_NAMESPACE = "kube-node-lease"
"""Where kubelets renew their heartbeat Lease (named after the node)."""


def binding_kind(pod_name: str) -> Kind:
    """The ``pods/<name>/binding`` subresource as a Kind, so ``Client.create`` POSTs to it.

    A workaround: ``Client.create`` takes no ``subresource`` (``patch``/``apply`` do). The plural carries the pod's
    name, which makes ``Kind.path(namespace)`` come out as ``/api/v1/namespaces/NS/pods/NAME/binding``.
    """
    return Kind("v1", "Binding", f"pods/{pod_name}/binding")
