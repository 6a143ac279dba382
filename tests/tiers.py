"""Which tests may run beside the end-to-end tier, and which may not.

``make test`` runs two pytest processes at once (``hack/test.sh``): the e2e tier with the integration modules that use
what exists once per machine — the tests' node network (the ``kanri-t0`` bridge, the 10.246.0.0/16 pod addresses,
the host's nftables, network namespaces), real nodes (containerd, kubelet, CNI), a local cluster (``kanri local up``,
its registry) — and, beside it, the unit tier and every other integration module. Each process has its own control
plane; the tests in the second one only start processes on free ports of the loopback addresses (Kafka's host
brokers use 127.0.0.1-3, each on a free port) and temporary directories of their own.

The real-node modules (marker ``real_nodes``, :data:`REAL_NODE_MODULES`) run in the second process's wake instead:
after the unit tier and the other integration modules, one at a time, while the e2e tier goes on. They share nothing
with the home-made node: their nodes sit on their own bridge (``kanri-rn0``, 10.250.0.0/24), their pods on
10.251.0.0/16 in the nodes' own network namespaces, their kube-proxies in those namespaces, and their control
planes' Service range is :data:`REAL_NODE_SERVICE_CIDR` (``KANRI_SERVICE_CIDR``, set by hack/test.sh, which every
control plane takes on its first start): the host routes it to a real node, while 10.96.0.0/16 is served on the host
by the home-made node's kube-proxy for its own cluster (run with 10.96.0.0/16 beside it, test_real_postgres's S3
client timed out on a ClusterIP). ``kanri down`` checks only its own cluster's things while another node holds the
machine's pod network (it used to count the e2e tier's namespaces and kube-proxy tables as its leftovers). Measured
beside the e2e tier's failover, Kafka, Cache chaos, PostgreSQL and backup modules (2026-12-07): all passed on both
sides.
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
    }
)
"""The integration modules (file stems) that run only beside nothing but the e2e tier (marker ``host_wide``)."""

REAL_NODE_MODULES = frozenset(
    {
        "test_real_cache",
        "test_real_cluster",
        "test_real_kafka",
        "test_real_local_up",
        "test_real_node",
        "test_real_node_addons",
        "test_real_postgres",
    }
)
"""Integration modules on real nodes alone (marker ``real_nodes``): after the second process, beside the e2e tier."""

REAL_NODE_SERVICE_CIDR = "10.97.0.0/16"
"""The Service range of the ``real_nodes`` process's control plane: not the home-made node's 10.96.0.0/16."""

REAL_NODE_CONFLICT = re.compile(
    r"local_node_support|running_node|LocalNode\b|kanri\.local\.(node|cluster)\b|start_registry\b"
    r"|\"local\", \"up\"\)"
)
"""What in a real-node module's source would meet the home-made node: a home-made node of its own, a local cluster
brought up without ``--real-nodes`` (``kanri local up`` starts one) or its registry. (A ``LocalRegistry`` in a test's
own directory takes a free port and meets nothing.)"""


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


def meets_home_made_node(source: Path) -> bool:
    """The module's source uses something the e2e tier's home-made node also uses (:data:`REAL_NODE_CONFLICT`)."""
    return REAL_NODE_CONFLICT.search(source.read_text()) is not None
