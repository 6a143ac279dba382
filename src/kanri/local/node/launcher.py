"""Start one container inside its pod's namespaces (run as a script, standard library only).

The kubelet runs ``python -I -S launcher.py SPEC PIDFD`` as root. This process stays as the container's **shim**
(as containerd's shim does): it enters a new PID namespace for its children, forks the container's init — PID 1
inside — puts it into the container's cgroups, reports its host pid on ``PIDFD``, forwards the stop signals to
it and, when it ends, exits the same way (killed by signal N → killed by N), so the kubelet sees the container's
exit. The shim itself stays out of the container's cgroups (its memory is not the container's).

The container's init, before ``exec``:

1. joins the pod's network namespace (``setns``); enters new mount, UTS and IPC namespaces (mounts made private,
   so nothing leaks back to the host; the pod's hostname),
2. assembles a root of its own on a fresh tmpfs from the spec's ``layout`` (read-only binds of the host's system
   directories, a snapshot of ``/etc``, its own ``/run``, ``/tmp``, a minimal ``/dev``, a new ``/proc`` for its
   PID namespace, a read-only ``/sys``) and ``pivot_root``s into it,
3. bind-mounts every volume (and the pod's ``/etc`` files) at its mount path inside that root, read-only where
   asked,
4. drops to the container's user, groups and working directory, and
5. ``exec``s the container's command, which is PID 1 of the namespace: a signal it has no handler for is ignored,
   as in any container; when it exits, the kernel kills everything else in the namespace.

It is a script, not an imported module, so it starts in tens of milliseconds (no site-packages, no kanri import)
and the JSON spec (which may hold secret values of environment variables) is deleted as soon as it has been read.
A failure before ``exec`` is written to stderr (the container's log) and exits with 127 (command not found) or 128
(anything else), as container runtimes do.
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import stat
import sys

# os.execvpe imports it to search PATH for a command given without a path (`python3`) — after the root has changed,
# where this interpreter's own library may not be: loaded now, so a container's relative command starts
import warnings  # noqa: F401

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1
# Syscalls glibc has no wrapper for; mount_setattr has one number on every architecture.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)
SYS_MOUNT_SETATTR = 442

# What a kubelet may send to stop a container; forwarded to its init (SIGKILL is the cgroup's business).
FORWARDED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

# The interpreter's own symbols include libc's (ctypes.util.find_library would cost ~12 ms of imports).
_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype or ''} on {target}",
    )


def _read_only(target: str, recursive: bool) -> None:
    """Make a bind mount read-only — with every mount below it when ``recursive`` (mount_setattr, Linux 5.12+;
    else only the top one)."""
    if recursive:
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        result = _libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR),
            ctypes.c_int(AT_FDCWD),
            target.encode(),
            ctypes.c_uint(AT_RECURSIVE),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        if result == 0:
            return
    _mount(None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _bind(source: str, target: str, read_only: bool) -> None:
    _make_mountpoint(target, os.path.isdir(source))
    _mount(source, target, MS_BIND | MS_REC)
    if read_only:
        _read_only(target, recursive=True)


def _make_mountpoint(target: str, is_dir: bool) -> None:
    if os.path.lexists(target):
        return
    if is_dir:
        os.makedirs(target)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))


# --- the container's init, in its new PID namespace ---------------------------------------------------------------


def enter_namespaces(spec: dict) -> None:  # type: ignore[type-arg]
    netns = spec.get("netns")
    if netns:
        fd = os.open(netns, os.O_RDONLY)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
        finally:
            os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC), "unshare")
    # Our mounts must not propagate back to the host's mount namespace (and pivot_root needs it).
    _mount(None, "/", MS_REC | MS_PRIVATE)
    hostname = spec.get("hostname")
    if hostname:
        encoded = hostname.encode()
        _check(_libc.sethostname(encoded, len(encoded)), "sethostname")


def _snapshot(source: str, target: str) -> None:
    """``target`` as ``source`` is now: its files copied (the host may rename new versions over them — a package
    install rewriting /etc/passwd — without reaching the container), its symlinks recreated, its directories
    bound read-only."""
    os.makedirs(target, exist_ok=True)
    with os.scandir(source) as entries:
        for entry in entries:
            path = os.path.join(target, entry.name)
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.path), path)
            elif stat.S_ISREG(info.st_mode):
                _copy(entry.path, path, info)
            elif stat.S_ISDIR(info.st_mode):
                os.mkdir(path)
                _mount(entry.path, path, MS_BIND | MS_REC)
                _read_only(path, recursive=True)


def _copy(source: str, target: str, info: os.stat_result) -> None:
    fd_in = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd_out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(fd_in, 1 << 16):
                os.write(fd_out, chunk)
            os.fchown(fd_out, info.st_uid, info.st_gid)
            os.fchmod(fd_out, stat.S_IMODE(info.st_mode))
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _dev(target: str) -> None:
    """A minimal /dev: the usual character devices (bound from the host's), its own pts, shm and mqueue."""
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, MS_NOSUID | MS_NOEXEC, "tmpfs", "mode=755,size=64k")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _bind(f"/dev/{name}", f"{target}/{name}", read_only=False)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):  # fmt: skip
        os.symlink(link, f"{target}/{name}")
    os.mkdir(f"{target}/pts")
    _mount("devpts", f"{target}/pts", MS_NOSUID | MS_NOEXEC, "devpts", "newinstance,ptmxmode=0666,mode=0620")
    os.mkdir(f"{target}/shm")
    _mount("shm", f"{target}/shm", MS_NOSUID | MS_NODEV, "tmpfs", "mode=1777")
    os.mkdir(f"{target}/mqueue")
    _mount("mqueue", f"{target}/mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mqueue")


def _proc(target: str) -> None:
    os.makedirs(target, exist_ok=True)
    _mount("proc", target, MS_NOSUID | MS_NODEV | MS_NOEXEC, "proc")
    # As runc does: kernel knobs are not the container's to turn.
    for knob in ("sys", "sysrq-trigger"):
        path = f"{target}/{knob}"
        if not os.path.exists(path):
            continue
        _mount(path, path, MS_BIND | MS_REC)
        _read_only(path, recursive=True)


def _sys(target: str) -> None:
    os.makedirs(target, exist_ok=True)
    try:
        # A fresh sysfs shows the pod's network namespace's links.
        _mount("sysfs", target, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "sysfs")
    except OSError:
        _bind("/sys", target, read_only=True)


def build_root(spec: dict) -> str:  # type: ignore[type-arg]
    """Assemble the container's root on a tmpfs at ``spec["root"]`` (a directory only this mount namespace
    covers) from ``spec["layout"]``, in order."""
    root = spec["root"]
    _mount("tmpfs", root, 0, "tmpfs", "mode=755")
    for op in spec["layout"]:
        kind = op["op"]
        target = root + op.get("target", "")
        if kind == "dir":
            os.makedirs(target, exist_ok=True)
            os.chmod(target, op.get("mode", 0o755))
        elif kind == "symlink":
            os.symlink(op["link"], target)
        elif kind == "bind":
            _bind(op["source"], target, bool(op.get("readOnly")))
        elif kind == "snapshot":
            _snapshot(op["source"], target)
        elif kind == "tmpfs":
            os.makedirs(target, exist_ok=True)
            _mount("tmpfs", target, MS_NOSUID | MS_NODEV, "tmpfs", f"mode={op.get('mode', 0o755):o}")
        elif kind == "dev":
            _dev(target)
        elif kind == "proc":
            _proc(target)
        elif kind == "sys":
            _sys(target)
        else:
            raise OSError(0, f"unknown layout step {kind!r}")
    return root  # type: ignore[no-any-return]


OLD_ROOT = "/.kanri-old-root"


def pivot(root: str) -> None:
    """Make ``root`` the root; the host's stays reachable at :data:`OLD_ROOT` until :func:`drop_old_root` (volume
    sources must still be in this mount namespace when they are bound)."""
    os.mkdir(root + OLD_ROOT)
    _check(_libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT), root.encode(), (root + OLD_ROOT).encode()), "pivot_root")
    os.chdir("/")


def drop_old_root() -> None:
    _check(_libc.umount2(OLD_ROOT.encode(), MNT_DETACH), "umount old root")
    os.rmdir(OLD_ROOT)


def mount_volumes(spec: dict, sources: list[int]) -> None:  # type: ignore[type-arg]
    """Bind every volume at its mount path inside the new root; ``sources`` were opened on the host before."""
    for mount, fd in zip(spec.get("mounts") or [], sources, strict=True):
        target = mount["target"]
        _make_mountpoint(target, stat.S_ISDIR(os.fstat(fd).st_mode))
        _mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
        if mount.get("readOnly"):
            _mount(None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)


def become_user(spec: dict) -> None:  # type: ignore[type-arg]
    cwd = spec.get("cwd") or "/"
    if not os.path.isdir(cwd):
        os.makedirs(cwd)  # as container runtimes do for a workingDir the image lacks
    uid, gid = spec.get("uid"), spec.get("gid")
    if gid is not None:
        os.setgroups(sorted({gid, *(spec.get("groups") or [])}))
        os.setgid(gid)
    if uid is not None:
        os.setuid(uid)
    os.chdir(cwd)


def container(spec: dict, go: int) -> int:  # type: ignore[type-arg]
    """The container's init: set up, then exec the command. Returns only on failure."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    for sig in (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ; a container's init does not
    try:
        enter_namespaces(spec)
        # Opened before the root changes: afterwards the host's paths are out of reach, their descriptors not.
        sources = [os.open(m["source"], os.O_PATH | os.O_CLOEXEC) for m in spec.get("mounts") or []]
        if spec.get("layout") is not None:
            pivot(build_root(spec))
        mount_volumes(spec, sources)
        for fd in sources:
            os.close(fd)
        if spec.get("layout") is not None:
            drop_old_root()
        become_user(spec)
    except OSError as exc:
        print(f"kanri-local: cannot start container: {exc}", file=sys.stderr, flush=True)
        return 128
    # The shim says go once we are in our cgroups (joining takes a v1 cgroup an RCU grace period, ~10 ms: it runs
    # while we set up); EOF means it died first, maybe before our parent-death signal was set.
    if os.read(go, 1) != b"g":
        return 128
    os.close(go)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    command = spec["argv"]
    try:
        os.execvpe(command[0], command, spec["env"])
    except OSError as exc:
        print(f"kanri-local: exec {command[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    return 0  # not reached


# --- the shim ------------------------------------------------------------------------------------------------------


def join_cgroups(directories: list[str], pid: int) -> None:
    for directory in directories:
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(pid))


def exit_like(status: int) -> int:
    """Leave the way the container did: killed by signal N → the shim killed by N (no core dump)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        return 128 + sig  # a signal that does not terminate by default
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    # Blocked until the child exists: a stop signal arriving during start-up is forwarded, not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    path = argv[1]
    pid_fd = int(argv[2]) if len(argv) > 2 else None
    with open(path) as f:
        spec = json.load(f)
    os.unlink(path)
    try:
        _check(_libc.unshare(CLONE_NEWPID), "unshare pid namespace")
    except OSError as exc:
        print(f"kanri-local: cannot start container: {exc}", file=sys.stderr, flush=True)
        return 128
    go_read, go_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        os.close(go_write)
        if pid_fd is not None:
            os.close(pid_fd)
        code = 128
        try:
            code = container(spec, go_read)
        except BaseException as exc:  # said in the container's log: a silent 128 tells nobody why
            print(f"kanri-local: cannot start container: {exc!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    os.close(go_read)
    try:
        join_cgroups(spec.get("cgroups") or [], child)
    except OSError as exc:
        print(f"kanri-local: cannot start container: joining its cgroup: {exc}", file=sys.stderr, flush=True)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        return 128
    if pid_fd is not None:
        os.write(pid_fd, f"{child}\n".encode())
        os.close(pid_fd)

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    os.write(go_write, b"g")
    os.close(go_write)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    _, status = os.waitpid(child, 0)
    return exit_like(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
