"""The first process of a node, run inside its network namespace and a new mount namespace (a slave of the host's:
the host's mounts show up inside, the node's never leak out):

    nsenter --net=/run/netns/<netns> unshare --mount --propagation slave python -m kanri.local.realnode.launch PLAN

It joins the node's cgroup before it starts anything (so every descendant is born inside it), gives the node its
own ``/run`` and ``/var/log`` (tmpfs: containerd's state, shim sockets, the pods' network namespaces, the kubelet's
``/var/log/containers`` links — all gone with the node), shows the kubelet the kernel tunables it wants without
letting it change the machine's, starts containerd, imports the images, starts kube-proxy (its nftables tables are
the node's namespace's) and becomes the kubelet (exec).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kanri.local.realnode import cgroups
from kanri.local.realnode.configs import KERNEL_TUNABLES
from kanri.local.realnode.plan import LaunchPlan
from kanri.local.realnode.spec import CONTAINERD_SOCKET, NodeLayout

CONTAINERD_START_TIMEOUT = 60.0


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def private_mounts(layout: NodeLayout) -> None:
    """The node's own /run and /var/log, and its view of the kernel tunables."""
    _mount("-t", "tmpfs", "-o", "mode=755", "kanri-node-run", "/run")
    _mount("-t", "tmpfs", "-o", "mode=755", "kanri-node-log", "/var/log")
    for name in KERNEL_TUNABLES:
        _mount("--bind", str(layout.sysctl_dir / name.replace("/", ".")), f"/proc/sys/{name}")


def start_containerd(layout: NodeLayout, bin_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start containerd and wait for its socket."""
    log = layout.containerd_log.open("ab")
    process = subprocess.Popen(
        [str(bin_dir / "containerd"), "--config", str(layout.containerd_config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + CONTAINERD_START_TIMEOUT
    while not CONTAINERD_SOCKET.is_socket():
        if process.poll() is not None:
            raise SystemExit(f"containerd exited with {process.returncode}; see {layout.containerd_log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"containerd made no socket in {CONTAINERD_START_TIMEOUT} s; see {layout.containerd_log}")
        time.sleep(0.05)
    return process


def import_image(
    bin_dir: Path, layout_dir: Path, repository: str, env: dict[str, str], enter: tuple[str, ...] = ()
) -> None:
    """Import an OCI image layout into containerd's ``k8s.io`` namespace (the CRI's) as ``repository:<its tag>``.

    ctr reads an OCI archive: the layout is streamed to it as a tar. Only the tagged manifest is imported (the
    layout's SBOM and signature manifests carry no tag). Importing what is there already is cheap (the content
    store is keyed by digest). ``enter`` prefixes ctr's command line (``nsenter`` into a running node's mount
    namespace, where its containerd socket is)."""
    tar = subprocess.Popen(["tar", "-C", str(layout_dir), "-cf", "-", "."], stdout=subprocess.PIPE)
    ctr = [str(bin_dir / "ctr"), "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", "images", "import"]
    result = subprocess.run(
        [*enter, *ctr, "--base-name", repository, "--local", "-"],
        stdin=tar.stdout,
        capture_output=True,
        env=env,
    )
    tar.wait()
    if result.returncode != 0:
        raise SystemExit(f"ctr import of {layout_dir} into {repository} failed: {result.stderr.decode().strip()}")


def start_kube_proxy(layout: NodeLayout, bin_dir: Path, args: list[str], env: dict[str, str]) -> None:
    """Start kube-proxy in the background: it waits for its Node and Services by itself; the kubelet (this
    process, after the exec) becomes its parent."""
    with layout.kube_proxy_log.open("ab") as log:
        subprocess.Popen(
            [str(bin_dir / "kube-proxy"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )


def main(argv: list[str]) -> None:
    plan = LaunchPlan.load(Path(argv[1]))
    cgroups.join(plan.cgroup, os.getpid())
    layout = NodeLayout(Path(plan.root))
    bin_dir = Path(plan.bin_dir)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
    private_mounts(layout)
    start_containerd(layout, bin_dir, env)
    for layout_dir, repository in plan.images:
        import_image(bin_dir, Path(layout_dir), repository, env)
    print(json.dumps({"event": "containerd-ready", "images": len(plan.images)}), flush=True)
    if plan.kube_proxy_args:
        start_kube_proxy(layout, bin_dir, plan.kube_proxy_args, env)
    log = os.open(layout.kubelet_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.dup2(log, 1)
    os.execve(str(bin_dir / "kubelet"), ["kubelet", *plan.kubelet_args], env)


if __name__ == "__main__":
    main(sys.argv)
