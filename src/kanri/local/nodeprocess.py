"""The node host (the local nodes) as a detached process next to the control plane (what ``kanri local up``
starts)."""

from __future__ import annotations

import sys
from pathlib import Path

from kanri.local.detached import DetachedProcess, DetachedProcessError
from kanri.local.node.control import socket_path


class NodeProcessError(DetachedProcessError):
    """The local node failed to start or stop; the message includes the tail of its log."""


class NodeProcess(DetachedProcess):
    """``python -m kanri.local.node`` on ``<cluster dir>/node`` (each node's files in ``node/<node name>``, the
    control socket ``node/control.sock``); logs in ``<cluster dir>/node.log``."""

    what = "local node"
    error = NodeProcessError

    def __init__(self, cluster_dir: Path) -> None:
        super().__init__(cluster_dir, "node")

    @property
    def node_dir(self) -> Path:
        """The node host's data dir; node ``N``'s volumes, pods' files and logs are in ``<node_dir>/N``."""
        return self.data_dir / "node"

    @property
    def control_socket(self) -> Path:
        return socket_path(self.node_dir)

    def marker(self) -> bytes:
        return f"--data-dir={self.node_dir}".encode()

    def start(self, kubeconfig: Path, apiserver_port: int, image_map: Path, extra_image_map: Path | None = None,
              timeout: float = 120.0, nodes: int = 3) -> int:  # fmt: skip
        """Start the node host with ``nodes`` nodes unless it runs already (then it keeps the nodes it has); its
        pid once it is ready."""
        if (pid := self.running_pid()) is not None:
            return pid
        args = [
            sys.executable,
            "-m",
            "kanri.local.node",
            f"--data-dir={self.node_dir}",
            f"--kubeconfig={kubeconfig}",
            f"--apiserver-port={apiserver_port}",
            f"--image-map={image_map}",
            f"--nodes={nodes}",
        ]
        if extra_image_map is not None:
            args.append(f"--extra-image-map={extra_image_map}")
        self.launch(args, timeout)
        pid = self.running_pid()
        if pid is None:
            raise NodeProcessError(f"local node reported ready but is not running\n{self.log_tail()}")
        return pid
