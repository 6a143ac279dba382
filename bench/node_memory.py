"""Benchmark what the extra local nodes cost: the node host's memory with 1 node and with 3.

    .venv/bin/python bench/node_memory.py                  # 1 and 3 nodes, 5 readings each after 20 s idle
    .venv/bin/python bench/node_memory.py --counts 1 3 6

For each count the real control plane and ``python -m kanri.local.node --nodes N`` (what ``kanri local up --nodes N``
starts, with the benchmark's own network names) run on a fresh scratch dir, idle, no pods; after ``--settle``
seconds (caches synced, a few heartbeats posted) the host's ``VmRSS`` is read ``--readings`` times a second apart
and the median kept. The difference to one node is what nodes 2..N cost: per node, a kubelet, a provisioner and a
reclaimer controller, a heartbeat task and a client of its own (the cache and watches are shared). Run it under
``flock /run/kanri-tests.lock`` on a machine where tests run. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _localcluster import Network, check_machine, local_cluster, rss_kib
from kanri.local import controlplane_binary

NETWORK: Network = {
    "bridge": "kbench1",
    "service_link": "kbench1-svc",
    "netns_prefix": "kbench1-",
    "pod_cidr": "10.248.0.0/16",
    "internal_ip": "10.248.0.1",
    "cluster_dns_ip": "10.96.254.53",
    "chaos_table": "kbench-chaos",
}


def host_rss_mib(count: int, binary: Path, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory(prefix="kanri-bench-nodes-") as scratch:
        with local_cluster(Path(scratch) / "cluster", binary, NETWORK, args.wait, nodes=count) as cluster:
            pid = cluster.node.running_pid()
            assert pid is not None
            time.sleep(args.settle)
            readings = []
            for _ in range(args.readings):
                readings.append(rss_kib(pid) / 1024)
                time.sleep(1)
        cluster.require_clean()
    return statistics.median(readings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 3], help="node counts to measure")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds to idle before reading")
    parser.add_argument("--readings", type=int, default=5, help="readings (a second apart) per count")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for another local node to stop")
    args = parser.parse_args()
    check_machine(NETWORK, args.wait)
    binary = controlplane_binary()
    results = {count: host_rss_mib(count, binary, args) for count in args.counts}
    base = results[min(results)]
    print("| nodes | node host VmRSS (median) | more than the smallest | per extra node |")
    print("|---|---|---|---|")
    for count, rss in results.items():
        extra = rss - base
        per = extra / (count - min(results)) if count > min(results) else 0.0
        print(f"| {count} | {rss:.1f} MiB | {extra:+.1f} MiB | {per:.1f} MiB |")


if __name__ == "__main__":
    main()
