"""Benchmark one real node (docs/real-nodes.md): start -> Ready (first start, with the image imports, and a
restart), pod create -> Running, and the resident memory of the node's kubelet and containerd (plus the shims).

    .venv/bin/python bench/real_node.py [--pods 10]

Starts its own control plane and node on scratch directories and removes them. Prints a Markdown table; record it in
docs/real-nodes.md with the command that produced it. Uses the machine's pod network: run it under
``flock /tmp/kanri-e2e.lock``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from kanri.local import ControlPlane
from kanri.local.realnode import NodeSpec, RealNode

NODE = "bench-real-node"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def pod_manifest(name: str, image: str) -> str:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}
    spec = {"nodeName": NODE, "dnsPolicy": "Default", "terminationGracePeriodSeconds": 1, "containers": [container]}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def pod_to_running(kubeconfig: Path, name: str, image: str, timeout: float = 60.0) -> float:
    started = time.monotonic()
    kubectl(kubeconfig, "create", "-f", "-", stdin=pod_manifest(name, image))
    while time.monotonic() - started < timeout:
        if kubectl(kubeconfig, "get", "pod", name, "-o", "jsonpath={.status.phase}") == "Running":
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"pod {name} not Running in {timeout} s")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10)
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-real-node-") as scratch:
        base = Path(scratch)
        control_plane = ControlPlane(base / "cp")
        endpoint = control_plane.start(exit_with_parent=True)
        node = RealNode(NodeSpec(NODE, "zone-a", 0), base / "node", base / "cp", images=("kanri-tools",))
        try:
            rows.append(("first start -> Ready (2 images imported)", f"{node.start():.1f} s"))
            image = node.image("kanri-tools").ref
            seconds = [pod_to_running(endpoint.kubeconfig, f"p{i}", image) for i in range(args.pods)]
            rows.append(
                (
                    f"pod create -> Running ({args.pods} pods, one at a time)",
                    f"p50 {statistics.median(seconds):.2f} s, p95 {percentile(seconds, 0.95):.2f} s",
                )
            )
            memory: dict[str, float] = {}
            for pid in node.pids():
                name = command_name(pid)
                if name.startswith(("kubelet", "containerd")):
                    memory[name] = memory.get(name, 0.0) + rss_mib(pid)
            for name, mib in sorted(memory.items()):
                rows.append((f"RSS {name} (sum, {args.pods} pods running)", f"{mib:.0f} MiB"))
            node.stop()
            rows.append(("restart -> Ready (images present)", f"{node.start():.1f} s"))
        finally:
            node.stop()
            control_plane.stop()
    print("| measure | value |\n|---|---|")
    for measure, value in rows:
        print(f"| {measure} | {value} |")


if __name__ == "__main__":
    main()
