"""The files a container expects of its image and runtime, made per pod: ``/etc/hosts``, ``/etc/hostname``,
``/etc/resolv.conf``, ``/etc/passwd`` and ``/etc/group`` — plus the mountpoints the host lacks.

There is no image filesystem on the local node: a container's root is assembled from the host's
(:mod:`kanri.local.node.rootfs`), with these files and its volumes bind-mounted over it. A mount needs an existing
mountpoint; the launcher makes a missing one in the container's own root, but one inside a directory the root binds
read-only from the host (``/var/lib/postgresql/data``, say) is created on the host and written to a list;
:class:`Mountpoints` removes them again, deepest first and only while empty, when the node stops. ``/etc/passwd``
and ``/etc/group`` get the image's users (the image map's ``users``) and an entry for a ``runAsUser`` the host does
not know — programs such as ``initdb`` look their user up.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kanri.local.node.mounts import Mount

Obj = dict[str, Any]


def hosts_file(pod: Obj, ip: str, cluster_domain: str) -> str:
    """The kubelet's ``/etc/hosts``: localhost, then the pod's own names (FQDN first when it has a subdomain)."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    hostname = spec.get("hostname") or meta["name"]
    names = [hostname]
    if spec.get("subdomain"):
        names.insert(0, f"{hostname}.{spec['subdomain']}.{meta['namespace']}.svc.{cluster_domain}")
    lines = [
        "# Kubernetes-managed hosts file (kanri local node).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{ip}\t{' '.join(names)}",
    ]
    lines += [f"{a['ip']}\t{' '.join(a.get('hostnames') or [])}" for a in spec.get("hostAliases") or []]
    return "\n".join(lines) + "\n"


def resolv_conf(pod: Obj, dns_ip: str, cluster_domain: str) -> str | None:
    """``/etc/resolv.conf`` per ``dnsPolicy``; None means the host's (``Default``, or host network without
    ``ClusterFirstWithHostNet``)."""
    spec = pod.get("spec") or {}
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    host_network = bool(spec.get("hostNetwork"))
    config = spec.get("dnsConfig") or {}
    if policy == "Default" or (host_network and policy == "ClusterFirst"):
        return None
    namespace = pod["metadata"]["namespace"]
    if policy == "None":
        servers, searches, options = config.get("nameservers") or [], config.get("searches") or [], []
    else:
        servers = [dns_ip, *(config.get("nameservers") or [])]
        searches = [f"{namespace}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain]
        searches += config.get("searches") or []
        options = ["ndots:5"]
    for option in config.get("options") or []:
        options = [o for o in options if not o.startswith(option["name"] + ":")]
        options.append(f"{option['name']}:{option['value']}" if option.get("value") else option["name"])
    lines = [f"nameserver {s}" for s in servers]
    if searches:
        lines.append("search " + " ".join(searches))
    if options:
        lines.append("options " + " ".join(options))
    return "\n".join(lines) + "\n"


def passwd_and_group(users: Iterable[Mapping[str, Any]], uid: int | None, gid: int | None) -> tuple[str, str] | None:
    """The container's ``/etc/passwd`` and ``/etc/group``: the host's, with the image's users in place of any host
    entry of the same name or id (the image's ``postgres`` is uid 26 even where the host's is 101), plus an entry
    for a ``runAsUser``/``runAsGroup`` neither knows; None when nothing differs from the host."""
    image_users = [(str(u["name"]), int(u["uid"]), int(u.get("gid", u["uid"])), str(u.get("home", "/"))) for u in users]
    names = {name for name, *_ in image_users}
    uids = {user_uid for _, user_uid, _, _ in image_users}
    gids = {user_gid for _, _, user_gid, _ in image_users}
    passwd_lines = [
        line
        for line in Path("/etc/passwd").read_text().splitlines()
        if line.count(":") < 6 or (line.split(":")[0] not in names and int(line.split(":")[2]) not in uids)
    ]
    group_lines = [
        line
        for line in Path("/etc/group").read_text().splitlines()
        if line.count(":") < 3 or (line.split(":")[0] not in names and int(line.split(":")[2]) not in gids)
    ]
    passwd_lines += [f"{n}:x:{u}:{g}:{n}:{home}:/bin/sh" for n, u, g, home in image_users]
    group_lines += [f"{n}:x:{g}:" for n, g in {n: g for n, _, g, _ in image_users}.items()]
    known_uids = {int(line.split(":")[2]) for line in passwd_lines if line.count(":") >= 6}
    known_gids = {int(line.split(":")[2]) for line in group_lines if line.count(":") >= 3}
    added = bool(image_users)
    if uid is not None and uid not in known_uids:
        passwd_lines.append(f"uid{uid}:x:{uid}:{gid if gid is not None else uid}:uid{uid}:/:/bin/sh")
        added = True
    if gid is not None and gid not in known_gids:
        group_lines.append(f"gid{gid}:x:{gid}:")
        added = True
    if not added:
        return None
    return "\n".join(passwd_lines) + "\n", "\n".join(group_lines) + "\n"


def primary_group(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


class Mountpoints:
    """Mountpoints created on the host for containers' mounts, listed in ``<data_dir>/mountpoints`` so they can be
    removed even after a crash."""

    def __init__(self, data_dir: Path) -> None:
        self.registry = data_dir / "mountpoints"

    def ensure(self, target: Path, is_file: bool) -> None:
        if target.exists() or target.is_symlink():
            return
        missing = [target]
        parent = target.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        self.registry.parent.mkdir(parents=True, exist_ok=True)
        with self.registry.open("a") as f:
            f.writelines(f"{path}\n" for path in reversed(missing))
        if is_file:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        else:
            target.mkdir(parents=True)

    def remove_all(self) -> list[str]:
        """Remove the recorded mountpoints that are still empty (deepest first); what could not be removed."""
        if not self.registry.exists():
            return []
        paths = sorted(set(self.registry.read_text().split()), key=lambda p: p.count("/"), reverse=True)
        left = []
        for raw in paths:
            path = Path(raw)
            try:
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                elif path.is_file() and path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                left.append(raw)
        self.registry.unlink()
        return left


def pod_file_mounts(pod_dir: Path, pod: Obj, ip: str, hostname: str, dns_ip: str, cluster_domain: str) -> list[Mount]:
    """Write the pod's ``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf`` under ``pod_dir/etc``; the mounts
    that show them."""
    etc = pod_dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    files = {"hosts": hosts_file(pod, ip, cluster_domain), "hostname": hostname + "\n"}
    resolv = resolv_conf(pod, dns_ip, cluster_domain)
    if resolv is not None:
        files["resolv.conf"] = resolv
    return [_etc_file(etc, name, f"/etc/{name}", text, read_only=name != "hosts") for name, text in files.items()]


def account_mounts(pod_dir: Path, container: str, users: Iterable[Mapping[str, Any]], uid: int | None,
                   gid: int | None) -> list[Mount]:  # fmt: skip
    """The container's own ``/etc/passwd`` and ``/etc/group`` (see :func:`passwd_and_group`), if it needs them."""
    accounts = passwd_and_group(users, uid, gid)
    if accounts is None:
        return []
    etc = pod_dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    return [
        _etc_file(etc, f"passwd.{container}", "/etc/passwd", accounts[0]),
        _etc_file(etc, f"group.{container}", "/etc/group", accounts[1]),
    ]


def _etc_file(etc: Path, name: str, target: str, text: str, read_only: bool = True) -> Mount:
    path = etc / name
    path.write_text(text)
    os.chmod(path, 0o644)
    return Mount(str(path), target, read_only=read_only)
