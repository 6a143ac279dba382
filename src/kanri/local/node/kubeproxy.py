"""The real kube-proxy (k8s.io/kubernetes v1.37, nftables mode) for the local cluster, and the guard around it.

Every local node shares the host's network namespace, so one kube-proxy serves the whole machine: the node that
owns the pod network (it holds the machine's ``NodeLock``) starts ``kanri-controlplane kube-proxy`` — the
control-plane binary holds kube-proxy too — as a child process, and stops it before it removes the bridge. Its
nftables table is always ``ip kube-proxy`` (and ``ip6 kube-proxy``), so a second one could not coexist anyway.

What the kernel needs for it, set here and put back on :meth:`KubeProxy.stop`:

- ``net.ipv4.ip_forward = 1``: a pod's packet to a ClusterIP arrives at the bridge's address, is DNATed to another
  pod and routed back onto the bridge.
- ``net.bridge.bridge-nf-call-iptables = 1`` (module ``br_netfilter``): the reply goes straight from pod to pod
  across the bridge; only then does it pass netfilter, where conntrack undoes the DNAT.
- our table ``ip kanri-<bridge>`` (:func:`guard_ruleset`): with forwarding on, anything a pod sends to an address
  outside the pod network, and anything routed into the pod network from another interface, is dropped — nothing
  ever leaves the machine (ClusterIPs are DNATed to pod addresses before the forward hook).

kube-proxy is told to leave every other sysctl alone (conntrack sizes and timeouts), runs with the node's name, and
treats the pod CIDR as the cluster CIDR. :class:`KubeProxyUnavailable` says why it could not run (no ``nft``, a
kernel without nftables NAT, no ``br_netfilter``, the process died); the caller falls back to the userspace proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import structlog

from kanri.local.node.options import NodeOptions
from kanri.local.ports import free_port

log = structlog.get_logger("kanri.local.kubeproxy")

KUBE_PROXY_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
"""kube-proxy's own tables (fixed names in its nftables proxier)."""
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
BRIDGE_NF_CALL = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_STOP_GRACE = 10.0


class KubeProxyUnavailable(RuntimeError):
    """kube-proxy cannot run here; the message says why, for the one log line of the fallback."""


def guard_table(options: NodeOptions) -> str:
    """The name of our table in the ``ip`` family."""
    return f"kanri-{options.bridge}"


def guard_ruleset(options: NodeOptions) -> str:
    """The ``nft -f`` input that (re)creates our table: it drops forwarded traffic from the pods to anything but a
    pod address, and traffic routed into the pod network from any other interface. Accepts everything else."""
    table, bridge, cidr = guard_table(options), options.bridge, options.pod_cidr
    return (
        f"table ip {table}\n"
        f"delete table ip {table}\n"  # the add before makes the delete safe: the file replaces the table atomically
        f"table ip {table} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter - 5; policy accept;\n"
        f'    iifname "{bridge}" ip daddr != {cidr} counter drop comment "pods reach only pods and services"\n'
        f'    oifname "{bridge}" iifname != "{bridge}" counter drop comment "nothing is routed into the pods"\n'
        "  }\n"
        "}\n"
    )


PROXY_KUBECONFIG = "proxy.kubeconfig"
"""What the control plane writes into its data dir for the ``system:kube-proxy`` identity (bound to the bootstrap
ClusterRole ``system:node-proxier``, which grants everything kube-proxy reads and writes)."""


def kubeconfig_for_proxy(node_kubeconfig: Path) -> Path:
    """kube-proxy's own identity, ``proxy.kubeconfig`` next to the node's kubeconfig (both in the control plane's
    data dir), as a real cluster runs it; the node's kubeconfig when the control plane wrote none."""
    own = node_kubeconfig.parent / PROXY_KUBECONFIG
    return own if own.is_file() else node_kubeconfig


def _nft(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, check=False)


def existing_tables(options: NodeOptions) -> list[str]:
    """Which of kube-proxy's tables and ours exist now, as ``family name`` (none when ``nft`` is missing)."""
    if shutil.which("nft") is None:
        return []
    listed = _nft("list", "tables")
    present = {tuple(line.split()[1:3]) for line in listed.stdout.splitlines() if line.startswith("table ")}
    wanted = [*KUBE_PROXY_TABLES, ("ip", guard_table(options))]
    return [f"{family} {name}" for family, name in wanted if (family, name) in present]


def delete_tables(options: NodeOptions) -> None:
    """Delete kube-proxy's tables and ours (kube-proxy leaves its rules when it exits)."""
    for table in existing_tables(options):
        result = _nft("delete", "table", *table.split())
        if result.returncode != 0:
            log.warning("nft table not deleted", table=table, error=result.stderr.strip())


def _pid_file(options: NodeOptions) -> Path:
    return options.data_dir / "kube-proxy.pid"


def running_pid(options: NodeOptions) -> int | None:
    """The pid of the kube-proxy this node's data dir recorded, if that process still runs it."""
    try:
        pid = int(_pid_file(options).read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if len(argv) > 1 and argv[1] == b"kube-proxy" else None


def leftovers(options: NodeOptions) -> list[str]:
    """What a stopped node's kube-proxy would have left: a table or the process; for ``find_leftovers``."""
    found = [f"nft table {table}" for table in existing_tables(options)]
    if (pid := running_pid(options)) is not None:
        found.append(f"kube-proxy process {pid}")
    return found


class Sysctls:
    """Sets sysctls and puts back what they were. The originals are kept in a file of the data dir, so a node that
    crashed restores them on its next stop instead of taking its own values for the originals."""

    def __init__(self, record: Path) -> None:
        self._record = record

    def _originals(self) -> dict[str, str]:
        try:
            data: dict[str, str] = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def set(self, path: Path, value: str) -> None:
        current = path.read_text().strip()
        if current == value:
            return
        originals = self._originals()
        originals.setdefault(str(path), current)
        self._record.parent.mkdir(parents=True, exist_ok=True)
        self._record.write_text(json.dumps(originals))
        path.write_text(value)

    def restore(self) -> None:
        for path, value in self._originals().items():
            with contextlib.suppress(OSError):
                Path(path).write_text(value)
        self._record.unlink(missing_ok=True)


class KubeProxy:
    """One kube-proxy process for ``options``' pod network; see the module docstring."""

    def __init__(self, options: NodeOptions, kubeconfig: Path, binary: Path | None = None) -> None:
        self.options = options
        self.kubeconfig = kubeconfig
        self._binary = binary
        self._process: asyncio.subprocess.Process | None = None
        self._sysctls = Sysctls(options.data_dir / "kube-proxy-sysctls.json")
        self.log_file = options.data_dir / "kube-proxy.log"

    def args(self, binary: Path) -> list[str]:
        """The command line: nftables mode, the node's name, the pod CIDR as the cluster's; no sysctl changed, no
        port on any address but loopback."""
        return [
            str(binary),
            "kube-proxy",
            f"--parent-pid={os.getpid()}",
            "--proxy-mode=nftables",
            f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={self.options.name}",
            f"--cluster-cidr={self.options.pod_cidr}",
            "--detect-local-mode=ClusterCIDR",
            f"--healthz-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            "--conntrack-max-per-core=0",
            "--conntrack-min=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--oom-score-adj=0",
        ]

    async def start(self, probe_ip: str, timeout: float = 60.0) -> None:
        """Prepare the kernel, start kube-proxy and return once it has programmed ``probe_ip`` (a ClusterIP that
        exists, the ``kubernetes`` Service's). Raises :class:`KubeProxyUnavailable`; call :meth:`stop` then too."""
        await asyncio.to_thread(self._prepare)
        binary = self._binary
        if binary is None:
            from kanri.local.build import controlplane_binary  # the binary the control plane runs: built already

            binary = await asyncio.to_thread(controlplane_binary)
        log_handle = self.log_file.open("ab")
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.args(binary), stdin=subprocess.DEVNULL, stdout=log_handle, stderr=log_handle
            )
        finally:
            log_handle.close()
        _pid_file(self.options).write_text(f"{self._process.pid}\n")
        try:
            async with asyncio.timeout(timeout):
                while not await asyncio.to_thread(self._programs, probe_ip):
                    if self._process.returncode is not None:
                        raise KubeProxyUnavailable(f"kube-proxy exited ({self._process.returncode}): {self._tail()}")
                    await asyncio.sleep(0.2)
        except TimeoutError:
            raise KubeProxyUnavailable(f"kube-proxy did not program {probe_ip} within {timeout:.0f}s: "
                                       f"{self._tail()}") from None  # fmt: skip
        log.info("kube-proxy running", mode="nftables", pid=self._process.pid, log=str(self.log_file))

    def _prepare(self) -> None:
        """Remove what an earlier run left, check nft, set the sysctls and install the guard table."""
        self.options.data_dir.mkdir(parents=True, exist_ok=True)
        self._kill_leftover()
        if shutil.which("nft") is None:
            raise KubeProxyUnavailable("nft is not installed (make setup installs Debian's nftables)")
        delete_tables(self.options)
        if not BRIDGE_NF_CALL.exists() and shutil.which("modprobe") is not None:
            subprocess.run(["modprobe", "br_netfilter"], capture_output=True, check=False)
        if not BRIDGE_NF_CALL.exists():
            raise KubeProxyUnavailable("the br_netfilter module is not loaded (bridged replies would skip the NAT)")
        result = _nft("-f", "-", stdin=guard_ruleset(self.options))
        if result.returncode != 0:
            raise KubeProxyUnavailable(f"nft refused our guard table: {result.stderr.strip()}")
        try:
            self._sysctls.set(BRIDGE_NF_CALL, "1")
            self._sysctls.set(IP_FORWARD, "1")
        except OSError as exc:
            raise KubeProxyUnavailable(f"cannot set a sysctl kube-proxy needs: {exc}") from exc

    def _kill_leftover(self) -> None:
        pid = running_pid(self.options)
        if pid is not None:
            log.info("stopping a kube-proxy left by an earlier run", pid=pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _programs(ip: str) -> bool:
        """Whether kube-proxy's ``cluster-ips`` set holds ``ip`` (it has synced Services at least once)."""
        result = _nft("list", "set", "ip", "kube-proxy", "cluster-ips")
        # Whole elements only: 10.96.0.10 must not count as 10.96.0.1.
        return (
            result.returncode == 0 and ip in result.stdout.replace("{", " ").replace("}", " ").replace(",", " ").split()
        )

    def _tail(self, lines: int = 5) -> str:
        try:
            text = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:])

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL), delete the tables and put the sysctls back. Idempotent."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(_STOP_GRACE):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        await asyncio.to_thread(self._clean_kernel)

    def _clean_kernel(self) -> None:
        self._kill_leftover()
        _pid_file(self.options).unlink(missing_ok=True)
        delete_tables(self.options)
        self._sysctls.restore()
