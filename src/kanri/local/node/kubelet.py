"""Containers as processes: a kubelet-lite for pods bound to the local node.

A controller on :mod:`kanri.runtime` keyed by Pod. For each pod bound to the node it keeps a :class:`PodWorker`
(one per pod uid) that runs every container as a local program (see :mod:`kanri.local.node.images`) in a session
and process group of its own, restarts it per ``restartPolicy`` with the kubelet's crash-loop back-off, and asks
the controller to look at the pod again whenever something changed; the reconcile then writes ``status`` through
``pods/status`` — only when it differs from what the pod says.

Deletion: SIGTERM to each container's process group, the pod's grace period, SIGKILL, a terminal phase written
(which makes the API server delete at once, as it does for a kubelet's final delete), then the pod object is
deleted with a uid precondition. :meth:`Kubelet.kill_all` (called by ``LocalNode.stop``) SIGKILLs everything at once:
this is a development runtime, pods do not outlive their node.

Not in this slice: probes (Ready = every container running), init containers, volumes, network namespaces.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import os
import pwd
import shutil
import signal
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import structlog

from kanri.local.node.containers import (
    ContainerState,
    EnvError,
    backoff_delay,
    build_status,
    expand,
    now_iso,
    owned_fields,
    resolve_env,
    should_restart,
)
from kanri.local.node.images import ImageMap, command_line
from kanri.local.node.kinds import delete_now
from kanri.local.node.options import NodeOptions
from kanri.runtime import ApiError, Cache, Client, Controller, ControllerOptions, EventRecorder, Request, Result
from kanri.runtime.kinds import CONFIG_MAP, POD, SECRET

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.kubelet")

_TERMINAL = ("Succeeded", "Failed")
_DEFAULT_GRACE = 30


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
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.stopping = asyncio.Event()
        self.grace = _grace_seconds(pod)
        self.task: asyncio.Task[None] | None = None
        self.terminated = asyncio.Event()
        self.restart_policy: str = pod["spec"].get("restartPolicy", "Always")

    def start(self) -> None:
        # A context of its own: the worker outlives the reconcile that started it (and its log bindings).
        self.task = asyncio.create_task(
            self._run(), name=f"pod {self.namespace}/{self.name}", context=contextvars.Context()
        )

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for container, state in zip(self.pod["spec"]["containers"], self.states, strict=True):
                    group.create_task(self._container(container, state))
        finally:
            self.terminated.set()
            self.kubelet.notify(self)

    def terminate(self, grace: float) -> None:
        """Stop every container: SIGTERM now, SIGKILL after ``grace`` seconds (done by the container loops)."""
        if self.stopping.is_set():
            return
        self.grace = grace
        self.stopping.set()
        for process in self.processes.values():
            _signal_group(process.pid, signal.SIGTERM)

    def kill_all(self) -> None:
        """SIGKILL every container's process group now (node shutdown)."""
        self.stopping.set()
        self.grace = 0
        for process in self.processes.values():
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
        kubelet = self.kubelet
        image = container.get("image", "")
        entry = kubelet.images.resolve(image)
        if entry is None:
            message = kubelet.images.not_mapped_message(image)
            state.kind, state.reason, state.message = "waiting", "ImageNotMapped", message
            kubelet.notify(self)
            await kubelet.events.warning(self.pod, "Failed", f"Failed to pull image: {message}")
            await self.stopping.wait()
            self._final(state)
            return
        crashes = 0
        while not self.stopping.is_set():
            try:
                env = await resolve_env(self.pod, container, kubelet.read_secret, kubelet.read_config_map, entry.env)
            except (EnvError, ApiError) as exc:
                reason = exc.reason if isinstance(exc, EnvError) else "CreateContainerConfigError"
                state.kind, state.reason, state.message = "waiting", reason, str(exc)
                kubelet.notify(self)
                await kubelet.events.warning(self.pod, "Failed", f"Error: {exc}")
                crashes += 1
                if await self._sleep_unless_stopping(kubelet.backoff(crashes)):
                    break
                continue
            argv = [expand(arg, env) for arg in command_line(container, entry)]
            started = datetime.now(UTC)
            try:
                returncode = await self._run_process(container, state, argv, env, entry.working_dir)
            except OSError as exc:
                state.kind, state.exit_code, state.reason = "terminated", 128, "StartError"
                state.message = f"failed to start container process {argv[:1]}: {exc}"
                state.started_at = state.finished_at = now_iso(started)
                await kubelet.events.warning(self.pod, "Failed", f"Error: {state.message}")
            else:
                state.kind, state.exit_code = "terminated", exit_code(returncode)
                state.reason, state.message = ("Completed" if returncode == 0 else "Error"), ""
                state.started_at, state.finished_at = now_iso(started), now_iso()
            code = state.exit_code or 0
            if self.stopping.is_set() or not should_restart(self.restart_policy, code):
                state.final = True
                kubelet.notify(self)
                break
            ran_for = (datetime.now(UTC) - started).total_seconds()
            crashes = 1 if ran_for > 2 * kubelet.options.restart_backoff_max else crashes + 1
            delay = kubelet.backoff(crashes)
            state.last_terminated = state.terminated_state()
            state.kind, state.reason = "waiting", "CrashLoopBackOff"
            state.message = (
                f"back-off {delay:g}s restarting failed container={state.name} pod={self.name}_{self.namespace}"
                f"({self.uid})"
            )
            kubelet.notify(self)
            if code != 0:
                await kubelet.events.warning(self.pod, "BackOff", "Back-off restarting failed container")
            if await self._sleep_unless_stopping(delay):
                break
            state.restart_count += 1
        if not state.final:
            self._final(state)
        kubelet.notify(self)

    async def _run_process(
        self, container: Obj, state: ContainerState, argv: list[str], env: Mapping[str, str], image_dir: str | None
    ) -> int:
        """Start the container's process, report it running, wait for it; SIGKILL after the grace period once
        stopping. Returns the raw returncode (negative: killed by that signal)."""
        kubelet = self.kubelet
        uid, gid = user_and_group(self.pod, container)
        path = log_path(kubelet.options.data_dir, self.namespace, self.name, self.uid, state.name, state.restart_count)
        path.parent.mkdir(parents=True, exist_ok=True)
        extra: dict[str, Any] = {}
        if uid is not None:
            extra = {"user": uid, "group": gid, "extra_groups": []}
        cwd = container.get("workingDir") or image_dir or "/"
        with path.open("ab") as output:
            process = await _spawn(argv, env, cwd, output, extra)
        self.processes[state.name] = process
        state.kind, state.reason, state.message = "running", "", ""
        state.started_at, state.ever_started = now_iso(), True
        kubelet.notify(self)
        log.info("container started", pod=f"{self.namespace}/{self.name}", container=state.name, pid=process.pid)
        await kubelet.events.normal(self.pod, "Started", f"Started container {state.name}")
        try:
            wait = asyncio.ensure_future(process.wait())
            stop = asyncio.ensure_future(self.stopping.wait())
            await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not wait.done():
                _signal_group(process.pid, signal.SIGTERM)  # again, for a process started as terminate() ran
                await kubelet.events.normal(self.pod, "Killing", f"Stopping container {state.name}")
                try:
                    await asyncio.wait_for(asyncio.shield(wait), self.grace)
                except TimeoutError:
                    _signal_group(process.pid, signal.SIGKILL)
            stop.cancel()
            returncode = await wait
        finally:
            # Whatever the process left behind in its group dies with it, as in a container's pid namespace.
            _signal_group(process.pid, signal.SIGKILL)
            self.processes.pop(state.name, None)
        return returncode


async def _spawn(argv: list[str], env: Mapping[str, str], cwd: str, output: IO[bytes], extra: Mapping[str, Any]) -> (
    asyncio.subprocess.Process
):  # fmt: skip
    return await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env),
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        start_new_session=True,  # its own session and process group: signals reach the whole tree
        **extra,
    )


class Kubelet:
    """Runs the containers of pods bound to ``options.name``; build its controller with :meth:`controller`."""

    def __init__(self, cache: Cache, client: Client, options: NodeOptions) -> None:
        self._cache = cache
        self._client = client
        self.options = options
        self.images = ImageMap.load(options.image_map_file, options.images)
        self.events = EventRecorder(client, component="kubelet")
        self.workers: dict[str, PodWorker] = {}
        """By pod uid."""
        self._controller = Controller(
            "kubelet", self, for_kind=POD, options=ControllerOptions(max_concurrent_reconciles=4, qps=50, burst=200)
        )

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
        await self._write_status(pod, worker)
        return None

    async def _write_status(self, pod: Obj, worker: PodWorker) -> None:
        status = build_status(pod, worker.states, host_ip=self.options.internal_ip, start_time=worker.start_time)
        if status == owned_fields(pod.get("status")):
            return
        meta = pod["metadata"]
        try:
            await self._client.patch(
                POD, meta["name"], {"status": status}, meta["namespace"], patch_type="strategic", subresource="status"
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

    # --- shutdown ------------------------------------------------------------------------------------------------

    def kill_all(self) -> None:
        """SIGKILL every container process group now. The pods' objects are left as they are."""
        for worker in self.workers.values():
            worker.kill_all()

    async def shutdown(self) -> None:
        """:meth:`kill_all`, then wait for every worker to notice."""
        self.kill_all()
        tasks = [w.task for w in self.workers.values() if w.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        self.workers.clear()
