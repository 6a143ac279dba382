"""Containers as processes: a kubelet-lite for pods bound to the local node.

A controller on :mod:`kanri.runtime` keyed by Pod. For each pod bound to the node it keeps a :class:`PodWorker`
(one per pod uid) that runs every container as a local program (see :mod:`kanri.local.node.images`) in a session
of its own, restarts it per ``restartPolicy`` with the kubelet's crash-loop back-off, and asks
the controller to look at the pod again whenever something changed; the reconcile then writes ``status`` through
``pods/status`` — only when it differs from what the pod says.

Deletion: SIGTERM to each container's init, the pod's grace period, then every process of its cgroup killed, a
terminal phase written (which makes the API server delete at once, as it does for a kubelet's final delete), then
the pod object is deleted with a uid precondition. :meth:`Kubelet.kill_all` (when the node host stops, and for the
``stop`` chaos verb: :meth:`Kubelet.power_off`) kills everything at once: pods do not outlive their node.

Before the first container starts, the worker gives the pod its network namespace and address
(:mod:`kanri.local.node.network`) and its volumes (:mod:`kanri.local.node.mounts`); each container process is
started by :mod:`kanri.local.node.launcher` inside that namespace, in a PID, mount, UTS and IPC namespace of its
own, on a root of its own (:mod:`kanri.local.node.rootfs`) and in a cgroup of its own with the container's limits
(:mod:`kanri.local.node.cgroups`). The pod's network namespace and cgroup are removed when its last container has
stopped.

Not here: init containers (ignored).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import json
import os
import pwd
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import structlog

from kanri.local.node import termination
from kanri.local.node.cgroups import Cgroups, ContainerCgroup, container_limits
from kanri.local.node.containers import (
    ContainerState,
    EnvError,
    backoff_delay,
    build_status,
    expand,
    now_iso,
    owned_fields,
    resolve_env,
    resume,
    should_restart,
)
from kanri.local.node.images import ImageEntry, ImageMap, command_line
from kanri.local.node.kinds import PERSISTENT_VOLUME, delete_now
from kanri.local.node.mounts import Mount, PodVolumes, VolumeNotReady, container_mounts, supplemental_groups
from kanri.local.node.network import AddressPool, NetworkError, PodNetwork
from kanri.local.node.options import NodeOptions
from kanri.local.node.probes import ContainerProber, ExecFn, subprocess_exec
from kanri.local.node.rootfs import host_mountpoint, named_paths, root_layout
from kanri.local.node.sandbox import Mountpoints, account_mounts, pod_file_mounts
from kanri.local.node.sessions import record_session
from kanri.local.node.state import NodeEvents, NodeState
from kanri.runtime import ApiError, Cache, Client, Controller, ControllerOptions, EventRecorder, Request, Result
from kanri.runtime.kinds import CONFIG_MAP, POD, PVC, SECRET, SERVICE, SERVICE_ACCOUNT

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.kubelet")

_TERMINAL = ("Succeeded", "Failed")
_DEFAULT_GRACE = 30
_LAUNCHER = str(Path(__file__).with_name("launcher.py"))
_VOLUME_RETRY = 2.0
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def log_path(data_dir: Path, namespace: str, pod_name: str, pod_uid: str, container: str, restart_count: int) -> Path:
    """Where a container's stdout and stderr go: ``<data_dir>/pods/<ns>_<pod>_<uid>/<container>/<restarts>.log``
    (the kubelet's ``/var/log/pods`` layout). The pod's directory is removed when the pod object is deleted."""
    return pod_dir(data_dir, namespace, pod_name, pod_uid) / container / f"{restart_count}.log"


def pod_dir(data_dir: Path, namespace: str, pod_name: str, pod_uid: str) -> Path:
    return data_dir / "pods" / f"{namespace}_{pod_name}_{pod_uid}"


def exit_code(returncode: int) -> int:
    """A shell-style exit code: killed by signal N is 128+N (SIGKILL → 137), as container runtimes report."""
    return returncode if returncode >= 0 else 128 - returncode


def user_and_group(pod: Obj, container: Obj) -> tuple[int | None, int | None]:
    """``runAsUser``/``runAsGroup`` of the container, else of the pod. With a user but no group, the user's
    primary group from the host's passwd (the image's, in Kubernetes), else 0."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = container.get("securityContext") or {}
    uid = context.get("runAsUser", pod_context.get("runAsUser"))
    gid = context.get("runAsGroup", pod_context.get("runAsGroup"))
    if uid is not None and gid is None:
        try:
            gid = pwd.getpwuid(int(uid)).pw_gid
        except KeyError:
            gid = 0
    return (None if uid is None else int(uid)), (None if gid is None else int(gid))


def _grace_seconds(pod: Obj) -> float:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds", _DEFAULT_GRACE)
    return float(grace)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal a container: its shim (the launcher) passes the signal on to the container's init only, as a
    runtime does — PID 1 ignores it unless it has a handler."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _write_private_json(path: Path, value: Obj) -> None:
    """Write ``value`` to a file only root may read."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        json.dump(value, f)


def _read_pid(fd: int) -> int | None:
    """The container init's host pid, as the launcher reports it (None: it failed before forking)."""
    try:
        data = b""
        while not data.endswith(b"\n") and (chunk := os.read(fd, 32)):
            data += chunk
        return int(data) if data.strip() else None
    finally:
        os.close(fd)


class PodWorker:
    """Runs one pod's containers until the pod finishes or :meth:`terminate` is called."""

    def __init__(self, kubelet: Kubelet, pod: Obj) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.start_time: str = (pod.get("status") or {}).get("startTime") or now_iso()
        containers = pod["spec"]["containers"]
        self.states = [ContainerState(c["name"], c.get("image", "")) for c in containers]
        resume(self.states, pod.get("status"))  # no-op for a new pod; a restarted node's pods count a restart
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        """Each running container's launcher (its shim), by container name."""
        self.init_pids: dict[str, int] = {}
        """Each running container's init (PID 1 inside), by host pid."""
        self.cgroups: dict[str, ContainerCgroup | None] = {}
        self.stopping = asyncio.Event()
        self.grace = _grace_seconds(pod)
        self.task: asyncio.Task[None] | None = None
        self.terminated = asyncio.Event()
        self.restart_policy: str = pod["spec"].get("restartPolicy", "Always")
        self.pod_ip: str | None = None
        self.netns: str | None = None
        self.volumes = PodVolumes(pod_dir(kubelet.options.data_dir, self.namespace, self.name, self.uid), kubelet)
        self.pod_mounts: list[Mount] = []
        self.setup_done = asyncio.Event()
        self._waiting_message = ""

    def start(self) -> None:
        # A context of its own: the worker outlives the reconcile that started it (and its log bindings).
        self.task = asyncio.create_task(
            self._run(), name=f"pod {self.namespace}/{self.name}", context=contextvars.Context()
        )

    async def _run(self) -> None:
        try:
            if await self._set_up():
                async with asyncio.TaskGroup() as group:
                    for container, state in zip(self.pod["spec"]["containers"], self.states, strict=True):
                        group.create_task(self._container(container, state))
            else:
                for state in self.states:
                    self._final(state)
        except Exception as exc:  # a bug of this node: never a pod left ContainerCreating without a word
            log.exception("pod worker failed", pod=f"{self.namespace}/{self.name}")
            with contextlib.suppress(Exception):
                await self.kubelet.events.warning(self.pod, "Failed", f"the node's pod worker failed: {exc!r}")
            raise
        finally:
            with contextlib.suppress(Exception):
                await self.kubelet.release(self)
            self.terminated.set()
            self.kubelet.notify(self)

    async def _set_up(self) -> bool:
        """The pod's network and volumes; retried until they exist or the pod stops. False when stopped first."""
        kubelet = self.kubelet
        spec = self.pod.get("spec") or {}
        while not self.stopping.is_set():
            try:
                if spec.get("hostNetwork") or kubelet.network is None:
                    self.pod_ip = kubelet.options.internal_ip
                else:
                    sandbox = await kubelet.network.attach(self.uid, kubelet.pool)
                    self.pod_ip, self.netns = sandbox.ip, str(sandbox.netns_path)
                await self.volumes.prepare(self.pod, time.monotonic)
                self.pod_mounts = await asyncio.to_thread(self._pod_files)
            except VolumeNotReady as exc:
                await self._waiting_for_volumes(str(exc), exc.reason)
            except NetworkError as exc:  # as the real kubelet says when CNI fails (say, no free address): retried
                await self._waiting(f"failed to set up the pod's network: {exc}", "ContainerCreating",
                                    "FailedCreatePodSandBox")  # fmt: skip
            except (ApiError, OSError) as exc:
                await self._waiting_for_volumes(f"setting up the pod failed: {exc}", "ContainerCreating")
            else:
                if self.stopping.is_set():
                    break  # stopped while a call waited (say, on a stopped node's gate)
                self.setup_done.set()
                kubelet.notify(self)
                return True
            if await self._sleep_unless_stopping(_VOLUME_RETRY):
                break
        return False

    async def _waiting_for_volumes(self, message: str, reason: str) -> None:
        await self._waiting(message, reason, "FailedMount")

    async def _waiting(self, message: str, reason: str, event: str) -> None:
        """Every container waits with ``reason``; a Warning Event ``event`` says why, once per distinct message (not
        once per retry)."""
        for state in self.states:
            state.kind, state.reason, state.message = "waiting", reason, message
        self.kubelet.notify(self)
        if message != self._waiting_message:
            self._waiting_message = message
            await self.kubelet.events.warning(self.pod, event, message)

    def _pod_files(self) -> list[Mount]:
        options = self.kubelet.options
        directory = pod_dir(options.data_dir, self.namespace, self.name, self.uid)
        assert self.pod_ip is not None
        return pod_file_mounts(
            directory, self.pod, self.pod_ip, self.hostname, options.cluster_dns_ip, options.cluster_domain
        )

    @property
    def directory(self) -> Path:
        """The pod's directory on the node (see :func:`pod_dir`)."""
        return pod_dir(self.kubelet.options.data_dir, self.namespace, self.name, self.uid)

    def _log_path(self, state: ContainerState) -> Path:
        """Where this run of the container logs (see :func:`log_path`)."""
        data_dir = self.kubelet.options.data_dir
        return log_path(data_dir, self.namespace, self.name, self.uid, state.name, state.restart_count)

    @property
    def hostname(self) -> str:
        return str((self.pod.get("spec") or {}).get("hostname") or self.name)[:63]

    def pod_with_ip(self) -> Obj:
        """The pod as its containers see it through the downward API (``status.podIP`` set)."""
        status = dict(self.pod.get("status") or {})
        if self.pod_ip:
            status["podIP"] = self.pod_ip
        return {**self.pod, "status": status}

    def terminate(self, grace: float) -> None:
        """Stop every container: SIGTERM now, SIGKILL after ``grace`` seconds (done by the container loops)."""
        if self.stopping.is_set():
            return
        self.grace = grace
        self.stopping.set()
        for process in self.processes.values():
            _signal(process.pid, signal.SIGTERM)

    def kill_all(self) -> None:
        """Kill every process of every container now (node shutdown)."""
        self.stopping.set()
        self.grace = 0
        for name in list(self.processes):
            self.kill(name)

    def kill(self, name: str) -> None:
        """End container ``name`` whole: every process in its cgroup (frozen first, so none forks away), then its
        shim's process group (which also ends the init through its parent-death signal, should cgroups be
        unavailable)."""
        cgroup = self.cgroups.get(name)
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.kill()
        process = self.processes.get(name)
        if process is not None:
            _signal_group(process.pid, signal.SIGKILL)

    async def _sleep_unless_stopping(self, seconds: float) -> bool:
        """Sleep; True when woken because the pod is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    def _final(self, state: ContainerState) -> None:
        state.final = True
        if state.kind == "waiting" and state.last_terminated is not None:
            # Stopped while backing off: the last run is what it ended with.
            last = state.last_terminated
            state.kind, state.exit_code, state.reason = "terminated", last.get("exitCode"), last.get("reason", "")
            state.started_at, state.finished_at = last.get("startedAt"), last.get("finishedAt")
            state.message, state.last_terminated = "", None
        elif state.kind == "waiting":
            # Never ran (unmapped image, bad env): terminated without an exit of its own, as the kubelet reports.
            state.kind, state.exit_code, state.reason = "terminated", 137, "ContainerStatusUnknown"
            state.message = "The container could not be located when the pod was terminated"
            state.finished_at = now_iso()

    async def _container(self, container: Obj, state: ContainerState) -> None:
        """Run one container until the pod stops or ``restartPolicy`` says it is done, backing off between runs."""
        kubelet = self.kubelet
        entry = kubelet.images.resolve(container.get("image", ""))
        if entry is None:
            await self._image_not_mapped(container, state)
            return
        crashes = 0
        while not self.stopping.is_set():
            env = await self._container_env(container, state, entry)
            if env is None:
                crashes += 1
                if await self._sleep_unless_stopping(kubelet.backoff(crashes)):
                    break
                continue
            # A frozen or stopped node starts no container until it runs again.
            await kubelet.state.running()
            if self.stopping.is_set():
                break  # stopped while reading the env or waiting
            started = await self._run_once(container, state, env, entry)
            code = state.exit_code or 0
            if self.stopping.is_set() or not should_restart(self.restart_policy, code):
                state.final = True
                kubelet.notify(self)
                break
            ran_for = (datetime.now(UTC) - started).total_seconds()
            crashes = 1 if ran_for > 2 * kubelet.options.restart_backoff_max else crashes + 1
            if await self._back_off(state, kubelet.backoff(crashes), code):
                break
            state.restart_count += 1
        if not state.final:
            self._final(state)
        kubelet.notify(self)

    async def _image_not_mapped(self, container: Obj, state: ContainerState) -> None:
        """An image the node cannot run: waiting, with a Warning, until the pod stops."""
        kubelet = self.kubelet
        message = kubelet.images.not_mapped_message(container.get("image", ""))
        state.kind, state.reason, state.message = "waiting", "ImageNotMapped", message
        kubelet.notify(self)
        await kubelet.events.warning(self.pod, "Failed", f"Failed to pull image: {message}")
        await self.stopping.wait()
        self._final(state)

    async def _container_env(self, container: Obj, state: ContainerState, entry: ImageEntry) -> dict[str, str] | None:
        """The container's environment; None (the state waiting, a Warning sent) when it cannot be built yet."""
        kubelet = self.kubelet
        try:
            base = {"PATH": _DEFAULT_PATH, "HOSTNAME": self.hostname, **kubelet.service_env(), **entry.env}
            return await resolve_env(self.pod_with_ip(), container, kubelet.read_secret, kubelet.read_config_map, base)
        except (EnvError, ApiError) as exc:
            reason = exc.reason if isinstance(exc, EnvError) else "CreateContainerConfigError"
            state.kind, state.reason, state.message = "waiting", reason, str(exc)
            kubelet.notify(self)
            await kubelet.events.warning(self.pod, "Failed", f"Error: {exc}")
            return None

    async def _run_once(
        self, container: Obj, state: ContainerState, env: dict[str, str], entry: ImageEntry
    ) -> datetime:
        """Run the container once and record in ``state`` how it ended; returns when it started."""
        kubelet = self.kubelet
        argv = [expand(arg, env) for arg in command_line(container, entry)]
        started = datetime.now(UTC)
        try:
            returncode, oom_killed = await self._run_process(container, state, argv, env, entry)
        except (OSError, VolumeNotReady) as exc:
            state.kind, state.exit_code, state.reason = "terminated", 128, "StartError"
            state.message = f"failed to start container process {argv[:1]}: {exc}"
            state.started_at = state.finished_at = now_iso(started)
            await kubelet.events.warning(self.pod, "Failed", f"Error: {state.message}")
            return started
        state.kind, state.exit_code = "terminated", exit_code(returncode)
        # As the kubelet reports it: the kernel's OOM killer ended a process of the container.
        state.reason = "OOMKilled" if oom_killed else ("Completed" if returncode == 0 else "Error")
        written = self.directory / "termination" / state.name
        state.message = termination.message(container, written, state.exit_code or 0, self._log_path(state))
        state.started_at, state.finished_at = now_iso(started), now_iso()
        return started

    async def _back_off(self, state: ContainerState, delay: float, code: int) -> bool:
        """CrashLoopBackOff for ``delay`` seconds before the next run; True when the pod stopped meanwhile."""
        kubelet = self.kubelet
        state.last_terminated = state.terminated_state()
        state.kind, state.reason = "waiting", "CrashLoopBackOff"
        state.message = (
            f"back-off {delay:g}s restarting failed container={state.name} pod={self.name}_{self.namespace}({self.uid})"
        )
        kubelet.notify(self)
        if code != 0:
            await kubelet.events.warning(self.pod, "BackOff", "Back-off restarting failed container")
        return await self._sleep_unless_stopping(delay)

    def launch_spec(self, container: Obj, argv: list[str], env: Mapping[str, str], entry: ImageEntry) -> Obj:
        """What the launcher needs: namespaces, mounts, user and command (see :mod:`kanri.local.node.launcher`)."""
        uid, gid = user_and_group(self.pod, container)
        directory = pod_dir(self.kubelet.options.data_dir, self.namespace, self.name, self.uid)
        mounts = [*self.pod_mounts, *account_mounts(directory, container["name"], entry.users, uid, gid)]
        mounts += container_mounts(container, self.volumes)
        # its termination-message file, emptied for each start (kanri.local.node.termination)
        written = termination.fresh_file(directory, container["name"])
        mounts.append(Mount(str(written), termination.target(container)))
        # A volume mounted at /tmp becomes the root's own /tmp, so the programs bound under /tmp (a checkout there)
        # are bound over it rather than hidden beneath it; else a new container's /tmp is empty, as a new
        # container's writable layer is.
        at_tmp = next((m for m in mounts if m.target.rstrip("/") == "/tmp" and not m.read_only), None)
        if at_tmp is not None:
            mounts.remove(at_tmp)
            tmp = Path(at_tmp.source)
        else:
            tmp = directory / "tmp" / container["name"]
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            tmp.chmod(0o1777)
        words = [*argv, *env.values(), *entry.command, *entry.args, entry.working_dir or ""]
        # the image's own files (entry.paths: e.g. an install's share/, which nothing names) and what is named
        layout, bound = root_layout(tmp, [*entry.paths, *named_paths(words)])
        for index, mount in enumerate(mounts):
            self._ensure_mountpoint(mount, mounts[:index], bound)
        self.kubelet.rootfs_dir.mkdir(parents=True, exist_ok=True)
        return {
            "root": str(self.kubelet.rootfs_dir),
            "layout": layout,
            "netns": self.netns,
            "hostname": self.hostname,
            "mounts": [m.as_json() for m in mounts],
            "uid": uid,
            "gid": gid,
            "groups": supplemental_groups(self.pod),
            "cwd": container.get("workingDir") or entry.working_dir or "/",
            "argv": argv,
            "env": dict(env),
        }

    def _ensure_mountpoint(self, mount: Mount, earlier: list[Mount], bound: list[str]) -> None:
        """Create a missing mountpoint where the container will look for it: inside an earlier mount that covers
        it (a volume mounted inside another volume), else on the host (recorded, removed at node stop) when the
        container's root binds that part of the host read-only; anywhere else the launcher makes it in the
        container's own root."""
        target, is_file = Path(mount.target), Path(mount.source).is_file()
        covering = [m for m in earlier if target.is_relative_to(m.target) and Path(m.source).is_dir()]
        if covering:
            outer = max(covering, key=lambda m: len(m.target))
            inside = Path(outer.source) / target.relative_to(outer.target)
            if not inside.exists():
                if is_file:
                    inside.parent.mkdir(parents=True, exist_ok=True)
                    inside.touch()
                else:
                    inside.mkdir(parents=True)
            return
        if host_mountpoint(str(target), bound):
            self.kubelet.mountpoints.ensure(target, is_file)

    async def _run_process(
        self, container: Obj, state: ContainerState, argv: list[str], env: Mapping[str, str], entry: ImageEntry
    ) -> tuple[int, bool]:
        """Start the container, report it running, wait for it; once stopping, kill it whole after the grace
        period. Returns the raw returncode (negative: killed by that signal) and whether the kernel's OOM killer
        ended a process of it."""
        kubelet = self.kubelet
        process, cgroup, launch = await self._start_process(container, state, argv, env, entry)
        state.kind, state.reason, state.message = "running", "", ""
        state.started_at, state.ever_started = now_iso(), True
        prober = self._prober(container, state, process, launch)
        kubelet.notify(self)
        pid = self.init_pids.get(state.name) or process.pid
        log.info("container started", pod=f"{self.namespace}/{self.name}", container=state.name, pid=pid)
        await kubelet.events.normal(self.pod, "Started", f"Started container {state.name}")
        if prober is not None:
            prober.start()
        try:
            returncode = await self._wait_unless_stopping(process, state.name)
        finally:
            if prober is not None:
                await prober.stop()
            state.probe_ready = state.probe_started = True  # the next run starts its own probes
            oom_killed = await self._remove_container(state.name, cgroup)
        return returncode, oom_killed

    async def _start_process(
        self, container: Obj, state: ContainerState, argv: list[str], env: Mapping[str, str], entry: ImageEntry
    ) -> tuple[asyncio.subprocess.Process, ContainerCgroup | None, Obj]:
        """Start the container's launcher in a cgroup of its own and register it (shim, cgroup, init pid).
        Returns the shim, the cgroup and the launch spec."""
        kubelet = self.kubelet
        path = self._log_path(state)
        path.parent.mkdir(parents=True, exist_ok=True)
        launch = await asyncio.to_thread(self.launch_spec, container, argv, env, entry)
        cgroup = await asyncio.to_thread(kubelet.cgroups.container, self.uid, state.name, container_limits(container))
        launch["cgroups"] = cgroup.paths() if cgroup is not None else []
        spec_path = path.parent / f"launch-{state.restart_count}.json"
        _write_private_json(spec_path, launch)  # it may hold secret env values; the launcher deletes it at once
        pid_read, pid_write = os.pipe()
        try:
            with path.open("ab") as output:
                process = await _spawn(
                    [sys.executable, "-I", "-S", _LAUNCHER, str(spec_path), str(pid_write)], output, pid_write
                )
        except BaseException:
            os.close(pid_read)
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)
            raise
        finally:
            os.close(pid_write)
        record_session(kubelet.options.data_dir, process.pid)
        self.processes[state.name] = process
        self.cgroups[state.name] = cgroup
        init_pid = await asyncio.to_thread(_read_pid, pid_read)
        if init_pid is not None:
            self.init_pids[state.name] = init_pid
        return process, cgroup, launch

    async def _wait_unless_stopping(self, process: asyncio.subprocess.Process, name: str) -> int:
        """Wait for container ``name`` to exit; once the pod is stopping, SIGTERM it and kill it whole after the
        grace period. Returns the raw returncode."""
        wait = asyncio.ensure_future(process.wait())
        stop = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not wait.done():
            _signal(process.pid, signal.SIGTERM)  # again, for a process started as terminate() ran
            await self.kubelet.events.normal(self.pod, "Killing", f"Stopping container {name}")
            try:
                await asyncio.wait_for(asyncio.shield(wait), self.grace)
            except TimeoutError:
                self.kill(name)
        stop.cancel()
        return await wait

    async def _remove_container(self, name: str, cgroup: ContainerCgroup | None) -> bool:
        """Forget container ``name`` and remove its cgroup; True when the kernel's OOM killer ended a process of
        it."""
        # Whatever is left of the container dies with its init, as in a container's PID namespace.
        self.kill(name)
        self.processes.pop(name, None)
        self.init_pids.pop(name, None)
        self.cgroups.pop(name, None)
        if cgroup is None:
            return False
        oom_killed = cgroup.oom_kills() > 0
        if not await asyncio.to_thread(cgroup.remove):
            log.warning("cgroup not removed", pod=f"{self.namespace}/{self.name}", cgroup=cgroup.paths())
        return oom_killed

    def _prober(
        self, container: Obj, state: ContainerState, process: asyncio.subprocess.Process, launch: Obj
    ) -> ContainerProber | None:
        """The container's probes (None without any); they drive ``state``'s started/ready and may kill it."""
        if not any(container.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe")):
            return None
        kubelet = self.kubelet
        state.probe_started = not container.get("startupProbe")
        state.probe_ready = False if container.get("readinessProbe") else state.probe_started

        def changed() -> None:
            state.probe_started, state.probe_ready = prober.started, prober.ready
            kubelet.notify(self)

        async def restart(message: str) -> None:
            verdict = prober.verdict
            await kubelet.events.normal(
                self.pod, "Killing", verdict.killing_message(state.name) if verdict else message
            )
            grace = verdict.grace_period_seconds if verdict and verdict.grace_period_seconds is not None else None
            _signal(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), self.grace if grace is None else float(grace))
            except TimeoutError:
                if self.processes.get(state.name) is process:
                    self.kill(state.name)

        async def event(kind: str, reason: str, message: str) -> None:
            await kubelet.events.event(self.pod, "Warning" if kind == "Warning" else "Normal", reason, message)

        # With a pod network, probes come from the node's own address (a partition lets only those through).
        own_network = self.netns is not None
        prober = ContainerProber(
            container,
            self.pod_ip,
            _exec_in_container(self.init_pids.get(state.name, process.pid), launch),
            on_change=changed,
            on_restart=restart,
            on_event=event,
            gate=kubelet.state,
            source_ip=kubelet.options.internal_ip if own_network else None,
        )
        return prober


def _exec_in_container(pid: int, launch: Obj) -> ExecFn:
    """Exec probes run in the container's namespaces (its PID namespace too: they die with it) and root, as its
    user, in its working directory, with its env."""
    nsenter = shutil.which("nsenter") or "nsenter"
    prefix = [nsenter, f"--target={pid}", "--net", "--mount", "--uts", "--ipc", "--pid", "--root", "--wd"]
    if launch.get("uid") is not None:
        prefix += [f"--setuid={launch['uid']}", f"--setgid={launch['gid'] or 0}"]
    run = subprocess_exec(env=launch["env"])

    async def exec_fn(argv: list[str], timeout: float) -> tuple[int, str]:
        return await run([*prefix, "--", *argv], timeout)

    return exec_fn


async def _spawn(argv: list[str], output: IO[bytes], pid_fd: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv,
        env={},
        cwd="/",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        pass_fds=(pid_fd,),
        start_new_session=True,  # its own session: `kanri local down` finds anything left by the session id
    )


class Kubelet:
    """Runs the containers of pods bound to ``options.name``; build its controller with :meth:`controller`."""

    def __init__(
        self,
        cache: Cache,
        client: Client,
        options: NodeOptions,
        network: PodNetwork | None = None,
        state: NodeState | None = None,
    ) -> None:
        self._cache = cache
        self._client = client
        self.options = options
        self.network = network
        """None: pods share the host's network (no pod IPs of their own)."""
        self.pool = AddressPool(options.pod_slice, options.internal_ip) if options.pod_slice else None
        """The node's slice of the pod network (None: the network's whole range)."""
        self.state = state or NodeState()
        self.mountpoints = Mountpoints(options.data_dir)
        self.cgroups = Cgroups(options.data_dir, options.name)
        self.rootfs_dir = options.data_dir / "rootfs"
        """An empty directory each container's launcher mounts its root's tmpfs on, in its own mount namespace."""
        self.images = ImageMap.load(options.image_map_file, options.images)
        self.events: EventRecorder = NodeEvents(client, self.state, component="kubelet")
        self.workers: dict[str, PodWorker] = {}
        """By pod uid."""
        self._controller = (
            Controller(
                f"kubelet-{options.name}",
                self,
                for_kind=POD,
                options=ControllerOptions(max_concurrent_reconciles=4, qps=50, burst=200),
            )
            .watches(SECRET, lambda obj: self._pods_using("secret", obj))
            .watches(CONFIG_MAP, lambda obj: self._pods_using("configMap", obj))
        )

    def _pods_using(self, kind: str, obj: Obj) -> Iterable[Request]:
        """Pods of this node with a volume from ``obj`` (a Secret or ConfigMap): their volumes are rewritten."""
        meta = obj["metadata"]
        name_key = "secretName" if kind == "secret" else "name"
        for worker in list(self.workers.values()):
            if worker.namespace != meta["namespace"]:
                continue
            for volume in (worker.pod.get("spec") or {}).get("volumes") or []:
                sources = [volume] + [p for p in (volume.get("projected") or {}).get("sources") or []]
                for source in sources:
                    ref = source.get(kind)
                    if ref is not None and ref.get(name_key if source is volume else "name") == meta["name"]:
                        yield Request(worker.namespace, worker.name)

    # --- volume sources (see kanri.local.node.mounts.VolumeSources) --------------------------------------------

    def secret(self, namespace: str, name: str) -> Obj | None:
        return self._cache.get(SECRET, name, namespace)

    def config_map(self, namespace: str, name: str) -> Obj | None:
        return self._cache.get(CONFIG_MAP, name, namespace)

    def claim_path(self, namespace: str, claim: str) -> Path:
        pvc = self._cache.get(PVC, claim, namespace)
        if pvc is None:
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" not found')
        volume_name = (pvc.get("spec") or {}).get("volumeName")
        if not volume_name or (pvc.get("status") or {}).get("phase") != "Bound":
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" is not bound yet')
        volume = self._cache.get(PERSISTENT_VOLUME, volume_name)
        if volume is None:
            raise VolumeNotReady(f'persistentvolume "{volume_name}" not found')
        spec = volume.get("spec") or {}
        path = (spec.get("local") or spec.get("hostPath") or {}).get("path")
        if not path or not Path(path).is_dir():
            raise VolumeNotReady(f'persistentvolume "{volume_name}" has no directory on this node', "Unsupported")
        return Path(path)

    async def token(self, pod: Obj, service_account: str, audience: str | None, expiration: int) -> str:
        meta = pod["metadata"]
        body: Obj = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": expiration,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        if audience:
            body["spec"]["audiences"] = [audience]
        answer = await self._client.create_subresource(
            SERVICE_ACCOUNT, service_account, "token", body, meta["namespace"]
        )
        return str(answer["status"]["token"])

    def service_env(self) -> dict[str, str]:
        """``KUBERNETES_SERVICE_HOST``/``_PORT`` (what in-cluster clients look for), from ``default/kubernetes``."""
        service = self._cache.get(SERVICE, "kubernetes", "default")
        if service is None or not (service.get("spec") or {}).get("clusterIP"):
            return {}
        host, port = service["spec"]["clusterIP"], str(service["spec"]["ports"][0]["port"])
        return {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }

    async def release(self, worker: PodWorker) -> None:
        """The pod's last process is gone: remove its cgroup and network namespace."""
        await asyncio.to_thread(self.cgroups.remove_pod, worker.uid)
        if self.network is not None:
            await self.network.detach(worker.uid)

    def controller(self) -> Controller:
        return self._controller

    def backoff(self, crashes: int) -> float:
        return backoff_delay(crashes, self.options.restart_backoff_base, self.options.restart_backoff_max)

    def notify(self, worker: PodWorker) -> None:
        """Something about ``worker``'s pod changed: reconcile it (which writes the status)."""
        with contextlib.suppress(RuntimeError):
            self._controller.queue.add(Request(worker.namespace, worker.name))

    async def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            secret = await self._client.get(SECRET, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        return data | dict(secret.get("stringData") or {})

    async def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            config_map = await self._client.get(CONFIG_MAP, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        return dict(config_map.get("data") or {})

    # --- the reconcile -------------------------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        await self.state.active()  # a stopped, frozen or partitioned kubelet does nothing
        if self.state.stopped:
            return None  # released because the host shuts down: a stopped node starts nothing
        pod = self._cache.get(POD, request.name, request.namespace)
        uid = pod["metadata"]["uid"] if pod is not None else None
        for other in list(self.workers.values()):
            # A worker whose pod is gone (force-deleted, or replaced by a pod of the same name) stops.
            if (other.namespace, other.name) == (request.namespace, request.name) and other.uid != uid:
                other.terminate(other.grace)
                if other.terminated.is_set():
                    self.workers.pop(other.uid, None)
        if pod is None or (pod.get("spec") or {}).get("nodeName") != self.options.name:
            return None
        assert uid is not None
        worker = self.workers.get(uid)
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            if worker is None:
                await self._finish_deletion(pod, None)
                return None
            worker.pod = pod
            worker.terminate(_grace_seconds(pod))
            if worker.terminated.is_set():
                await self._finish_deletion(pod, worker)
            return None
        if worker is None:
            if (pod.get("status") or {}).get("phase") in _TERMINAL:
                return None  # finished before (e.g. before the node restarted): nothing to run
            worker = self.workers[uid] = PodWorker(self, pod)
            worker.start()
        worker.pod = pod
        if worker.setup_done.is_set() and not worker.stopping.is_set():
            # Secret/ConfigMap volumes follow their objects (this reconcile may come from such a change).
            with contextlib.suppress(VolumeNotReady, OSError, ApiError):
                await worker.volumes.prepare(pod, time.monotonic)
        await self._write_status(pod, worker)
        return None

    async def _write_status(self, pod: Obj, worker: PodWorker) -> None:
        status = build_status(
            pod, worker.states, host_ip=self.options.internal_ip, start_time=worker.start_time, pod_ip=worker.pod_ip
        )
        if status == owned_fields(pod.get("status")):
            return
        meta = pod["metadata"]
        body = dict(status)
        for key in ("podIPs", "hostIPs"):
            if key in body:
                # A strategic merge would add the new address next to the old one (a restarted node gives the pod
                # a new address): replace the list instead.
                body[key] = [{"$patch": "replace"}, *body[key]]
        try:
            await self._client.patch(
                POD, meta["name"], {"status": body}, meta["namespace"], patch_type="strategic", subresource="status"
            )
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def _finish_deletion(self, pod: Obj, worker: PodWorker | None) -> None:
        """Every process is gone: write the terminal phase, delete the pod object (uid precondition), drop logs."""
        meta = pod["metadata"]
        if worker is not None:
            await self._write_status(pod, worker)
        elif (pod.get("status") or {}).get("phase") not in _TERMINAL:
            patch = {"status": {"phase": "Failed"}}
            with contextlib.suppress(ApiError):
                await self._client.patch(POD, meta["name"], patch, meta["namespace"], subresource="status")
        await delete_now(self._client, pod)
        self.workers.pop(meta["uid"], None)
        shutil.rmtree(pod_dir(self.options.data_dir, meta["namespace"], meta["name"], meta["uid"]), ignore_errors=True)
        log.info("pod deleted", pod=f"{meta['namespace']}/{meta['name']}")

    # --- power (the chaos verbs stop and start) -----------------------------------------------------------------

    async def power_off(self) -> None:
        """What a node losing power does to its containers: every one of them SIGKILLed at once (the node's whole
        cgroup tree frozen, killed, thawed), no status written. The workers are forgotten, so :meth:`power_on`
        starts the pods still bound here afresh."""
        await self.shutdown(grace=0.0)  # no SIGTERM first: the power is gone

    def power_on(self) -> None:
        """A rebooted kubelet's resync: look at every pod bound to the node (the gate is open again by now)."""
        for pod in self._cache.list(POD):
            if (pod.get("spec") or {}).get("nodeName") == self.options.name:
                with contextlib.suppress(RuntimeError):
                    self._controller.queue.add(Request(pod["metadata"]["namespace"], pod["metadata"]["name"]))

    # --- shutdown ------------------------------------------------------------------------------------------------

    def kill_all(self) -> None:
        """Kill every container whole now. The pods' objects are left as they are."""
        for worker in self.workers.values():
            worker.kill_all()
        self.cgroups.kill_all()  # also what a worker no longer tracks

    async def shutdown(self, grace: float = 0.0) -> None:
        """Stop every container — SIGTERM with up to ``grace`` seconds (PostgreSQL gets to shut down cleanly),
        then SIGKILL — and wait for every worker to notice. The pods' objects are left as they are."""
        tasks = [w.task for w in self.workers.values() if w.task is not None]
        if grace > 0 and tasks:
            for worker in self.workers.values():
                worker.terminate(min(worker.grace, grace))
            await asyncio.wait(tasks, timeout=grace + 2)
        self.kill_all()
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        self.workers.clear()
