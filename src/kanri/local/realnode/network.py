"""The real nodes' network on the host: one bridge, and per node a network namespace joined to it by a veth pair.

Layout::

    host netns:  kanri-rn0 (bridge, 10.250.0.1/24) ── rnh<id> ═══ eth0 (10.250.0.<10+i>/24)  netns kanri-rn-<id>
                                                                   cni0 (10.251.<i>.1/24) ── the node's pods

The API server listens on the host's 127.0.0.1 only. A node reaches it at the bridge address: a DNAT rule of the
host (nftables table ``ip kanri-realnode``) sends the port on to 127.0.0.1, which the bridge accepts because its
``route_localnet`` is on; the local registry's port, when nodes pull from it, the same way. The API server reaches
each kubelet at the node's address through the bridge's connected route. Inside the node, the CNI bridge plugin
(run by containerd) gives each pod its own namespace and address.

Routing follows the addressing plan, so no node needs to know which others run: node ``j``'s pods
(``10.251.<j>.0/24``) are reached through node ``j``'s address (``10.250.0.<10+j>``), on the host and in every other
node, for every index a node may have. A route to a node that does not run just finds no neighbour. Pods reach the
host and, through the DNAT rule, the API server without masquerade: the host routes their addresses back.

A partition is a table of the node's own (``inet kanri-partition``, in its namespace) that drops everything through
``eth0``: the node loses the other nodes and the control plane at once, its pods still reach each other.

A stopped node leaves nothing: its namespace dies with its last process (its veth pair with it), and the bridge and
the table go with the last node.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
from collections.abc import Iterator
from pathlib import Path

from kanri.local.realnode.spec import GATEWAY, HOST_BRIDGE, MAX_NODES, NODE_NETWORK, NodeSpec, node_ip, pod_cidr

NAT_TABLE = "kanri-realnode"
LOOPBACK_CHAIN = "apiserver"
"""The table's DNAT chain: named for its first rule, it also forwards the local registry's port."""
PARTITION_TABLE = "kanri-partition"
NETNS_DIR = Path("/run/netns")
HOST_LOCK = Path("/run/kanri-realnode.lock")


class NetworkError(RuntimeError):
    """An ``ip`` or ``nft`` command failed; the message carries its stderr."""


def _run(*args: str, check: bool = True, stdin: str | None = None) -> str:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _pod_routes(skip: int | None = None) -> str:
    """``ip -batch`` lines routing every node's pod network to that node's address (but node ``skip``'s own)."""
    return "".join(f"route replace {pod_cidr(i)} via {node_ip(i)} dev {{dev}}\n" for i in range(MAX_NODES) if i != skip)


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Held while a node changes the host's side (the bridge, the table): two nodes starting or stopping at once
    must not remove what the other just made."""
    with HOST_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_host_network(apiserver_port: int) -> None:
    """Create the bridge, the table and the DNAT rule for this API server port unless they exist (idempotent).

    One rule per port: the nodes of two local clusters share the bridge, each reaching its own API server."""
    if not _link_exists(HOST_BRIDGE):
        _run("ip", "link", "add", HOST_BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/{NODE_NETWORK.prefixlen}", "dev", HOST_BRIDGE)
    _run("ip", "link", "set", HOST_BRIDGE, "up")
    _run("ip", "-batch", "-", stdin=_pod_routes().format(dev=HOST_BRIDGE))
    # DNAT to 127.0.0.1 is dropped as a martian unless the receiving interface allows loopback destinations.
    Path(f"/proc/sys/net/ipv4/conf/{HOST_BRIDGE}/route_localnet").write_text("1\n")
    forward_to_loopback(apiserver_port)


def forward_to_loopback(port: int) -> None:
    """The DNAT rule that sends the nodes' connections to the gateway's ``port`` on to the host's 127.0.0.1 (the API
    server's port, the local registry's); idempotent. Needs :func:`ensure_host_network` first."""
    _run("nft", "add", "table", "ip", NAT_TABLE)
    chain = "{ type nat hook prerouting priority dstnat; policy accept; }"
    _run("nft", "add", "chain", "ip", NAT_TABLE, LOOPBACK_CHAIN, chain)
    match = f'iifname "{HOST_BRIDGE}" ip daddr {GATEWAY} tcp dport {port}'
    if f"dport {port} " not in _run("nft", "list", "chain", "ip", NAT_TABLE, LOOPBACK_CHAIN):
        _run("nft", f"add rule ip {NAT_TABLE} {LOOPBACK_CHAIN} {match} dnat to 127.0.0.1:{port}")


def add_node_network(spec: NodeSpec) -> None:
    """Create the node's namespace and its veth pair (``eth0`` inside, on the host bridge outside)."""
    remove_node_network(spec)
    _run("ip", "netns", "add", spec.netns)
    peer = f"rnn{spec.short_id}"
    _run("ip", "link", "add", spec.host_link, "type", "veth", "peer", "name", peer, "netns", spec.netns)
    _run("ip", "link", "set", spec.host_link, "master", HOST_BRIDGE, "up")
    inside = ("ip", "-n", spec.netns)
    _run(*inside, "link", "set", peer, "name", "eth0")
    _run(*inside, "addr", "add", f"{spec.ip}/{NODE_NETWORK.prefixlen}", "dev", "eth0")
    _run(*inside, "link", "set", "eth0", "up")
    _run(*inside, "link", "set", "lo", "up")
    _run(*inside, "route", "add", "default", "via", spec.gateway)
    _run(*inside, "-batch", "-", stdin=_pod_routes(skip=spec.index).format(dev="eth0"))
    # the node routes between its pods (cni0) and the bridge (eth0), whoever made its bridge first
    _run("ip", "netns", "exec", spec.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")


def _in_node(spec: NodeSpec, *args: str, check: bool = True, stdin: str | None = None) -> str:
    return _run("ip", "netns", "exec", spec.netns, *args, check=check, stdin=stdin)


def partition(spec: NodeSpec) -> None:
    """Cut the node off the bridge: drop every packet in or out of its ``eth0`` (idempotent)."""
    rules = (
        f"table inet {PARTITION_TABLE}\n"
        f"delete table inet {PARTITION_TABLE}\n"  # replaces the table atomically, whether it existed or not
        f"table inet {PARTITION_TABLE} {{\n"
        "  chain prerouting { type filter hook prerouting priority raw; policy accept;"
        ' iifname "eth0" drop comment "partitioned"; }\n'
        "  chain postrouting { type filter hook postrouting priority raw; policy accept;"
        ' oifname "eth0" drop comment "partitioned"; }\n'
        "}\n"
    )
    _in_node(spec, "nft", "-f", "-", stdin=rules)


def heal(spec: NodeSpec) -> None:
    """Undo :func:`partition` (nothing to do when the node is not partitioned)."""
    if is_partitioned(spec):
        _in_node(spec, "nft", "delete", "table", "inet", PARTITION_TABLE)


def is_partitioned(spec: NodeSpec) -> bool:
    if not (NETNS_DIR / spec.netns).exists():
        return False
    return bool(_in_node(spec, "nft", "list", "table", "inet", PARTITION_TABLE, check=False))


def route_services(service_cidr: str, via: NodeSpec) -> None:
    """Reach the cluster's Service addresses from the host through node ``via``.

    kube-proxy runs in each node's namespace, not on the host, so a ClusterIP means nothing here until routed to a
    node: its kube-proxy DNATs the packet to an endpoint and masquerades it (the host's address is outside the pod
    network), so the reply comes back through the same node. Like a load balancer in front of one node, it reaches
    nothing while that node is stopped or partitioned: route through another one first. The route lives on the
    bridge and goes with it."""
    _run("ip", "route", "replace", service_cidr, "via", via.ip, "dev", HOST_BRIDGE)


def unroute_services(service_cidr: str) -> None:
    """Remove the host's route to the Service addresses (nothing to do when there is none)."""
    _run("ip", "route", "del", service_cidr, "dev", HOST_BRIDGE, check=False)


def remove_node_network(spec: NodeSpec) -> None:
    """Remove the node's veth pair and namespace name (the namespace itself dies with its last process)."""
    if _link_exists(spec.host_link):
        _run("ip", "link", "del", spec.host_link, check=False)
    if (NETNS_DIR / spec.netns).exists():
        _run("ip", "netns", "del", spec.netns)


def remove_host_network_if_unused() -> None:
    """Remove the bridge and the DNAT table once no node's link is on the bridge."""
    if _link_exists(HOST_BRIDGE):
        if any(Path(f"/sys/class/net/{HOST_BRIDGE}/brif").iterdir()):
            return
        _run("ip", "link", "del", HOST_BRIDGE)
    _run("nft", "delete", "table", "ip", NAT_TABLE, check=False)


def leftovers(spec: NodeSpec) -> list[str]:
    """What of the node's network still exists (empty once it is stopped)."""
    found = []
    if (NETNS_DIR / spec.netns).exists():
        found.append(f"network namespace {spec.netns}")
    if _link_exists(spec.host_link):
        found.append(f"link {spec.host_link}")
    return found


def host_leftovers() -> list[str]:
    """The bridge and the DNAT table, if either exists (empty once the last node is stopped)."""
    found = [f"bridge {HOST_BRIDGE}"] if _link_exists(HOST_BRIDGE) else []
    if _run("nft", "list", "table", "ip", NAT_TABLE, check=False):
        found.append(f"nftables table ip {NAT_TABLE}")
    return found
