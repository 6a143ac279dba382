"""Which tests may run beside the end-to-end tier, and which may not.

``make test`` runs two pytest processes at once (``hack/test.sh``): the e2e tier with the integration modules that use
what exists once per machine — the tests' node network (the ``kanri-t0`` bridge, the 10.246.0.0/16 pod addresses,
the host's nftables, network namespaces), real nodes (containerd, kubelet, CNI), a local cluster (``kanri local up``,
its registry) — and, beside it, the unit tier and every other integration module. Each process has its own control
plane; the tests in the second one only start processes on free ports of the loopback addresses (Kafka's host
brokers use 127.0.0.1-3, each on a free port) and temporary directories of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

HOST_WIDE_MODULES = frozenset(
    {
        "test_images_push",
        "test_local_cli",
        "test_local_kube_proxy",
        "test_local_kubelet",
        "test_local_kubelet_api",
        "test_local_node",
        "test_local_nodes",
        "test_local_services",
        "test_real_cluster",
        "test_real_kafka",
        "test_real_local_up",
        "test_real_node",
        "test_real_node_addons",
        "test_real_postgres",
    }
)
"""The integration modules (file stems) that run only beside nothing but the e2e tier (marker ``host_wide``)."""

HOST_WIDE_USE = re.compile(
    r"local_node_support|kanri\.local\.realnode|running_node|NodeHost|LocalNode\b"
    r"|kanri\.local\.registry|kanri\.local\.cluster|\bnft\b|netns|\"local\", \"up\"|kanri local up"
    r"|kanri\.local\.node\.(host|node|network|services|kubelet|kubeproxy|sandbox|dns)"
)
"""What in a module's source says it uses something that exists once per machine (tests/unit/test_tiers.py checks
that every integration module it matches is in :data:`HOST_WIDE_MODULES`)."""


def uses_host_wide(source: Path) -> bool:
    """The module's source names something that exists once per machine."""
    return HOST_WIDE_USE.search(source.read_text()) is not None
