"""The runtime on a hostile API path: the Greeting operator runs through a fault-injecting proxy (429s, 500s, hung
requests, dropped, expired and silent watches) or against an API server that restarts, and still converges — without
writing the same thing twice."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio

from examples.greeting.operator import GREETING, Greeting, GreetingReconciler
from kanri.local.controlplane import ControlPlane, Endpoint
from kanri.runtime import (
    ApiError,
    Client,
    Controller,
    ControllerOptions,
    Informer,
    Manager,
    ManagerOptions,
    Request,
    Result,
    WatchTiming,
    child_name,
    crd_for,
    get_condition,
)
from kanri.runtime._informer import Event
from kanri.runtime.kinds import CONFIG_MAP, CRD, NAMESPACE
from tests.faultproxy import FaultProxy, Record
from tests.support import eventually

Obj = dict[str, Any]

# The server ends each watch after 2-4 s, so a healthy quiet watch always ends before the 5 s inactivity timeout;
# only a stream that really went silent trips it. Short backoffs keep recovery within the tests' budgets.
TIMING = WatchTiming(min_timeout=2, inactivity=5.0, backoff_base=0.2, backoff_max=2.0)
# A hung write must cost seconds, not the client's 60 s request timeout.
CONTROLLER = ControllerOptions(max_concurrent_reconciles=4, reconcile_timeout=2.0)

GREETINGS = r"/greetings$"
CONFIG_MAPS = r"/configmaps$"


# --- fixtures and helpers ------------------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def direct(control_plane: Endpoint) -> AsyncIterator[Client]:
    """A client straight to the API server (no faults), with the Greeting CRD installed."""
    client = await Client.from_kubeconfig(str(control_plane.kubeconfig))
    try:
        await install_crd(client)
        yield client
    finally:
        await client.close()


@pytest_asyncio.fixture(loop_scope="session")
async def proxy(control_plane: Endpoint) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(control_plane.kubeconfig) as running:
        yield running


async def install_crd(client: Client) -> None:
    """Apply the CRD (idempotent: other tests may have done it) and wait until it serves Greetings."""
    crd = await client.apply(CRD, crd_for(Greeting), field_manager="runtime-faults-test")

    async def established() -> bool:
        current = await client.get(CRD, crd["metadata"]["name"])
        condition = get_condition((current.get("status") or {}).get("conditions"), "Established")
        return condition is not None and condition["status"] == "True"

    await eventually(established, timeout=30)


class FailureCountingReconciler:
    """The example's reconciler, unchanged, counting per Greeting the reconciles that failed or timed out."""

    def __init__(self, inner: GreetingReconciler) -> None:
        self.inner = inner
        self.failed: Counter[str] = Counter()

    async def reconcile(self, request: Request) -> Result | None:
        try:
            return await self.inner.reconcile(request)
        except BaseException:  # an error, or the cancellation of a reconcile that timed out
            self.failed[request.name] += 1
            raise


@dataclass
class Operator:
    manager: Manager
    reconciler: FailureCountingReconciler


@contextlib.asynccontextmanager
async def running_operator(client: Client, namespace: str) -> AsyncIterator[Operator]:
    """The Greeting operator, running (caches synced) until the block ends; a crash of the manager fails the test."""
    manager = Manager(
        client,
        ManagerOptions(
            name="greeting-faults",
            leader_election=False,
            health_port=None,
            namespace=namespace,
            watch_timing=TIMING,
        ),
    )
    reconciler = FailureCountingReconciler(GreetingReconciler(manager))
    manager.add(Controller("greeting", reconciler, for_kind=GREETING, options=CONTROLLER).owns(CONFIG_MAP))
    task = asyncio.create_task(manager.run(handle_signals=False), name="manager")

    async def ready() -> bool:
        if task.done():
            await task  # raises what killed it
        return manager.ready()

    try:
        await eventually(ready, timeout=30)
        yield Operator(manager, reconciler)
    finally:
        manager.stop()
        await task


def greeting(name: str, namespace: str, message: str) -> Obj:
    return {
        "apiVersion": GREETING.api_version,
        "kind": GREETING.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"message": message},
    }


def config_map_name(greeting_name: str) -> str:
    return child_name(greeting_name, "greeting")


def history(proxy: FaultProxy, greeting_name: str) -> str:
    """The requests about one Greeting and its ConfigMap, and every watch, for a failure message."""
    lines = [
        f"{r.at:9.3f} {r.method:5} {r.path} rv={r.query.get('resourceVersion')} fault={r.fault} "
        f"client={r.status} server={r.upstream_status}"
        for r in proxy.log
        if r.watch or f"/{greeting_name}" in r.path
    ]
    return "\n".join(lines)


async def converged(client: Client, namespace: str, name: str, message: str) -> bool:
    """The Greeting has its ConfigMap with ``message``, controlled by it, and says Ready for its generation."""
    owner = await client.get(GREETING, name, namespace)
    try:
        config_map = await client.get(CONFIG_MAP, config_map_name(name), namespace)
    except ApiError as exc:
        if exc.not_found:
            return False
        raise
    status = owner.get("status") or {}
    ready = get_condition(status.get("conditions"), "Ready")
    refs = config_map["metadata"].get("ownerReferences") or []
    return (
        config_map.get("data") == {"message": message}
        and [(r["uid"], r.get("controller")) for r in refs] == [(owner["metadata"]["uid"], True)]
        and ready is not None
        and ready["status"] == "True"
        and status.get("observedGeneration") == owner["metadata"]["generation"]
    )


async def until(condition: Callable[[], bool], *, timeout: float) -> None:
    """Wait for something in memory (a counter of the informer or the proxy) to become true."""

    async def check() -> bool:
        return condition()

    await eventually(check, timeout=timeout)


async def all_converged(client: Client, namespace: str, messages: dict[str, str]) -> bool:
    results = await asyncio.gather(*(converged(client, namespace, n, m) for n, m in messages.items()))
    return all(results)


@contextlib.asynccontextmanager
async def recorded_changes(client: Client, namespace: str) -> AsyncIterator[list[Event]]:
    """Every change to the namespace's ConfigMaps, as seen by an observer on a fault-free connection (except the CA
    bundle kube-controller-manager publishes into every namespace, at a moment of its choosing)."""
    changes: list[Event] = []
    observer = Informer(client, CONFIG_MAP, namespace=namespace)

    def record(event: Event) -> None:
        if event.obj["metadata"]["name"] != "kube-root-ca.crt":
            changes.append(event)

    observer.add_handler(record)
    task = asyncio.create_task(observer.run(), name="observer")
    try:
        await observer.synced.wait()
        changes.clear()
        yield changes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- tests ---------------------------------------------------------------------------------------------------------


async def test_greetings_converge_through_throttling_errors_hangs_and_dropped_watches_without_duplicate_writes(
    direct: Client, proxy: FaultProxy, namespace: str
) -> None:
    count = 20
    names = [f"hello-{i}" for i in range(count)]
    messages = {name: f"hello number {i}" for i, name in enumerate(names)}
    unlucky = config_map_name(names[3])
    async with asyncio.timeout(90), recorded_changes(direct, namespace) as changes:
        faults = [
            # The first list of Greetings fails; the client retries it.
            proxy.fail(500, method="GET", path=GREETINGS, watch=False, times=2),
            # ConfigMap writes throttled, then failing before they reach the server.
            proxy.fail(429, method="PATCH", path=r"/configmaps/", times=4, retry_after=1),
            proxy.fail(500, method="PATCH", path=r"/configmaps/", times=3),
            # One ConfigMap write reaches the server, but its response is lost: the client retries a write that
            # already happened.
            lost := proxy.fail(500, method="PATCH", path=f"/configmaps/{unlucky}$", after_forward=True),
            # Status writes fail (a merge patch is not retried by the client: the reconcile fails and is requeued)...
            proxy.fail(503, method="PATCH", path=r"/greetings/[^/]+/status$", times=3),
            # ...or hang until the reconcile times out.
            proxy.hang(method="PATCH", path=r"/greetings/[^/]+/status$", times=2),
            # Watches: one never answered, others cut mid-stream.
            proxy.hang(path=CONFIG_MAPS, watch=True),
            proxy.cut_watch(after_events=5, path=GREETINGS),
            proxy.cut_watch(after_events=3, path=CONFIG_MAPS, times=2),
        ]
        async with proxy.client() as client, running_operator(client, namespace) as operator:
            for i, name in enumerate(names):
                await direct.create(GREETING, greeting(name, namespace, messages[name]))
                if i == count // 2:
                    proxy.drop_watches()  # every watch open right now, mid-run
            await eventually(lambda: all_converged(direct, namespace, messages), timeout=60)
            assert operator.manager.cache.informer(GREETING).relists == 1  # watches resumed; never a relist

        unfired = [rule for rule in faults if not rule.spent]
        assert not unfired, f"faults that never happened: {unfired}"

    # The ConfigMap writes that reached the API server (whether or not the client heard back).
    owners = {config_map_name(name): name for name in names}
    applies: dict[str, list[Record]] = {child: [] for child in owners}
    for record in proxy.requests("PATCH", r"/configmaps/"):
        if record.forwarded:
            applies[record.path.rpartition("/")[2]].append(record)
    status_written = Counter(
        r.path.split("/")[-2] for r in proxy.requests("PATCH", r"/greetings/[^/]+/status$") if r.upstream_status == 200
    )
    # Server-side apply created each ConfigMap exactly once, however often a write was retried.
    assert {child: [r.upstream_status for r in records].count(201) for child, records in applies.items()} == {
        child: 1 for child in owners
    }
    # Every apply after the first changed nothing: an observer saw each ConfigMap added once, never modified.
    assert sorted((e.type, e.obj["metadata"]["name"]) for e in changes) == sorted(("ADDED", c) for c in owners)
    # And every apply after the first has a cause. The operator applies only when its cache lacks the ConfigMap, so
    # a repeat is either the client retrying a write whose answer it never got (the injected lost response, or a
    # reconcile that timed out mid-write), or a reconcile that ran before the ConfigMap's watch event reached the
    # cache (that watch is hung and cut here). Such a reconcile is triggered only by a failed reconcile (a retry) or
    # by the Greeting's own successful status write (a MODIFIED event); the ConfigMap's events come with it in the
    # cache, and watches resume without replay. Hence per ConfigMap:
    #     applies <= 1 + unanswered applies + failed reconciles + status writes
    # An operator that applied on every reconcile (rather than only what differs) would break it.
    for child, records in applies.items():
        owner = owners[child]
        unanswered = sum(r.status is None or r.status >= 300 for r in records)
        bound = 1 + unanswered + operator.reconciler.failed[owner] + status_written[owner]
        assert len(records) <= bound, history(proxy, owner)
    assert lost.hits == 1


async def test_a_watch_answered_with_410_makes_the_informer_relist_and_see_later_changes(
    direct: Client, proxy: FaultProxy, namespace: str
) -> None:
    async with asyncio.timeout(60), proxy.client() as client, running_operator(client, namespace) as operator:
        manager = operator.manager
        informer = manager.cache.informer(GREETING)
        await direct.create(GREETING, greeting("early", namespace, "hello"))
        await eventually(lambda: converged(direct, namespace, "early", "hello"))
        relists = informer.relists

        expired = proxy.expire_watch(path=GREETINGS)
        proxy.drop_watches(GREETINGS)  # reconnect now rather than when the server ends the watch
        await until(lambda: informer.relists > relists, timeout=20)

        assert expired.hits == 1
        greeting_requests = proxy.requests(path=GREETINGS)
        after_gone = greeting_requests[[r.fault for r in greeting_requests].index("gone") + 1]
        assert not after_gone.watch, "a 410 must be followed by a list, not by another watch"
        # Changes made after the relist arrive through the new watch.
        await direct.create(GREETING, greeting("late", namespace, "hi"))
        await direct.patch(GREETING, "early", {"spec": {"message": "hello again"}}, namespace)
        await eventually(lambda: converged(direct, namespace, "late", "hi"), timeout=20)
        await eventually(lambda: converged(direct, namespace, "early", "hello again"), timeout=20)
        assert informer.relists == relists + 1


async def test_a_silent_watch_is_abandoned_after_the_inactivity_timeout_and_the_informer_resumes(
    direct: Client, proxy: FaultProxy, namespace: str
) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(60), proxy.client() as client, running_operator(client, namespace) as operator:
        manager = operator.manager
        informer = manager.cache.informer(GREETING)
        relists, rewatches = informer.relists, informer.rewatches
        silent = proxy.silence_watch(path=GREETINGS)
        proxy.drop_watches(GREETINGS)
        await until(lambda: silent.hits == 1, timeout=10)
        silenced_at = loop.time()

        await direct.create(GREETING, greeting("quiet", namespace, "psst"))
        await asyncio.sleep(1.0)
        # The silence is real: the operator has not heard of the new Greeting.
        assert manager.cache.get(GREETING, "quiet", namespace) is None

        await eventually(lambda: converged(direct, namespace, "quiet", "psst"), timeout=20)
        waited = loop.time() - silenced_at
        assert waited >= TIMING.inactivity - 0.5, f"converged after {waited:.1f}s: before the silent watch timed out"
        assert informer.relists == relists, "a silent watch resumes from its resourceVersion; no relist is needed"
        assert informer.rewatches >= rewatches + 2  # the silent watch and the one that replaced it


async def test_the_operator_carries_on_after_an_api_server_restart(tmp_path: Path) -> None:
    control_plane = ControlPlane(tmp_path / "cp")
    endpoint = await asyncio.to_thread(control_plane.start, exit_with_parent=True)
    try:
        async with asyncio.timeout(120):
            client = await Client.from_kubeconfig(str(endpoint.kubeconfig))
            try:
                await install_crd(client)
                namespace = f"restart-{secrets.token_hex(3)}"
                await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                async with running_operator(client, namespace):
                    await client.create(GREETING, greeting("steady", namespace, "before"))
                    await eventually(lambda: converged(client, namespace, "steady", "before"))

                    await asyncio.to_thread(control_plane.stop)
                    await asyncio.sleep(3)
                    restarted = await asyncio.to_thread(control_plane.start, exit_with_parent=True)
                    assert restarted.server == endpoint.server

                    await client.create(GREETING, greeting("fresh", namespace, "after"))
                    await client.patch(GREETING, "steady", {"spec": {"message": "after"}}, namespace)
                    await eventually(lambda: converged(client, namespace, "fresh", "after"), timeout=30)
                    await eventually(lambda: converged(client, namespace, "steady", "after"), timeout=30)
            finally:
                await client.close()
    finally:
        await asyncio.to_thread(control_plane.stop)
