"""Start one container process inside its pod's namespaces (run as a script, standard library only).

The kubelet runs ``python -I -S launcher.py SPEC`` as root; this program then

1. joins the pod's network namespace (``setns``),
2. enters a new mount namespace (mounts made private, so nothing leaks back to the host) and a new UTS namespace
   (the pod's hostname),
3. bind-mounts every volume (and the pod's ``/etc/hosts``, ``/etc/hostname``, ``/etc/resolv.conf``, ``/etc/passwd``,
   ``/etc/group``) at its mount path, read-only where asked,
4. drops to the container's user, groups and working directory, and
5. ``exec``s the container's command — so the process the kubelet watches and signals *is* the container's.

It is a script, not an imported module, so it starts in tens of milliseconds (no site-packages, no kanri import)
and the JSON spec (which may hold secret values of environment variables) is deleted as soon as it has been read.
A failure before ``exec`` is written to stderr (the container's log) and exits with 127 (command not found) or 128
(anything else), as container runtimes do.
"""

import ctypes
import ctypes.util
import json
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, flags: int) -> None:
    _check(
        _libc.mount(source.encode() if source else None, target.encode(), None, ctypes.c_ulong(flags), None),
        f"mount {source or ''} on {target}",
    )


def enter_namespaces(spec: dict) -> None:  # type: ignore[type-arg]
    netns = spec.get("netns")
    if netns:
        fd = os.open(netns, os.O_RDONLY)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
        finally:
            os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    # Our mounts must not propagate back to the host's mount namespace.
    _mount(None, "/", MS_REC | MS_PRIVATE)
    hostname = spec.get("hostname")
    if hostname:
        encoded = hostname.encode()
        _check(_libc.sethostname(encoded, len(encoded)), "sethostname")


def mount_volumes(spec: dict) -> None:  # type: ignore[type-arg]
    mounts = spec.get("mounts") or []
    # Every source is opened first: a later mount (a volume over a directory) may hide where an earlier-listed
    # source lives on the host, but a file descriptor keeps pointing at it.
    sources = [os.open(m["source"], os.O_PATH | os.O_CLOEXEC) for m in mounts]
    try:
        for mount, fd in zip(mounts, sources, strict=True):
            target = mount["target"]
            _mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
            if mount.get("readOnly"):
                _mount(None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)
    finally:
        for fd in sources:
            os.close(fd)


def become_user(spec: dict) -> None:  # type: ignore[type-arg]
    uid, gid = spec.get("uid"), spec.get("gid")
    if gid is not None:
        os.setgroups(sorted({gid, *(spec.get("groups") or [])}))
        os.setgid(gid)
    if uid is not None:
        os.setuid(uid)
    os.chdir(spec.get("cwd") or "/")


def main(argv: list[str]) -> int:
    path = argv[1]
    with open(path) as f:
        spec = json.load(f)
    os.unlink(path)
    env = spec["env"]
    try:
        enter_namespaces(spec)
        mount_volumes(spec)
        become_user(spec)
    except OSError as exc:
        print(f"kanri-local: cannot start container: {exc}", file=sys.stderr, flush=True)
        return 128
    command = spec["argv"]
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"kanri-local: exec {command[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
