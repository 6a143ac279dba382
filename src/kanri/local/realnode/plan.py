"""What a node's launcher (launch.py) is told: a JSON file in the node's directory, written at each start."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LaunchPlan:
    """What the launcher needs, written by :class:`~kanri.local.realnode.node.RealNode` as JSON."""

    root: str
    cgroup: str
    bin_dir: str
    images: list[tuple[str, str]]  # (OCI layout directory, repository to import its tag into)
    kubelet_args: list[str]
    kube_proxy_args: list[str] = field(default_factory=list)  # none: no kube-proxy

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> LaunchPlan:
        data = json.loads(path.read_text())
        data["images"] = [tuple(pair) for pair in data["images"]]
        return cls(**data)
