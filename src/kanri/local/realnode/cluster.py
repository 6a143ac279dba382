"""Several real nodes of one control plane, started and stopped together: node ``i`` is in zone ``ZONES[i % 3]``
(the ``topology.kubernetes.io/zone`` label), with the address and pod network of index ``i`` (spec.py), so that
three nodes stand for three zones the way kind's nodes share a host.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kanri.local.realnode.node import NodeRegistry, RealNode
from kanri.local.realnode.spec import NodeSpec

ZONES = ("kanri-a", "kanri-b", "kanri-c")


class RealCluster:
    """``count`` nodes named ``<prefix>-<i>``, each with its directory ``data_dir/<name>``; the other arguments are
    :class:`RealNode`'s, the same for every node, but ``first_node_images``: images only node 0 imports (each image
    is imported at every start of every node that has it, so one only a single pod runs, pinned there, costs once).
    """

    def __init__(
        self,
        control_plane_dir: Path,
        data_dir: Path,
        *,
        count: int = 3,
        prefix: str = "kanri-node",
        images: tuple[str, ...] = (),
        first_node_images: tuple[str, ...] = (),
        extra_layouts: tuple[tuple[Path, str], ...] = (),
        cluster_dns: str | None = None,
        registry: NodeRegistry | None = None,
    ) -> None:
        self.nodes = [
            RealNode(
                NodeSpec(f"{prefix}-{i}", ZONES[i % len(ZONES)], i),
                data_dir / f"{prefix}-{i}",
                control_plane_dir,
                images=images + (first_node_images if i == 0 else ()),
                extra_layouts=extra_layouts,
                cluster_dns=cluster_dns,
                registry=registry,
            )
            for i in range(count)
        ]

    def _each(self, action: Callable[[RealNode], float | None]) -> list[float | None]:
        """Run ``action`` on every node at once (a node's start is mostly waiting); the first error is raised once
        all are done."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            futures = [pool.submit(action, node) for node in self.nodes]
        return [future.result() for future in futures]

    def start(self) -> dict[str, float]:
        """Start every node at once and wait until all are Ready; each node's seconds to Ready. If one fails, all
        are stopped and the error raised."""
        try:
            seconds = self._each(lambda node: node.start())
        except BaseException:
            self.stop()
            raise
        return {node.spec.name: float(s or 0.0) for node, s in zip(self.nodes, seconds, strict=True)}

    def stop(self) -> None:
        """Stop every node (a power loss of each: see :meth:`RealNode.stop`)."""
        self._each(lambda node: node.stop())

    def deregister(self) -> None:
        """Delete every node's Node object (after :meth:`stop`)."""
        for node in self.nodes:
            node.deregister()

    def leftovers(self) -> list[str]:
        """What of any node still exists (empty after :meth:`stop`); the host's bridge and table are
        :func:`network.host_leftovers`, shared with every other real node on the machine."""
        return [item for node in self.nodes for item in node.leftovers()]
