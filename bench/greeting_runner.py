"""The two kanri contestants of bench/runtime_operator.py, each run as its own process so its RSS is its own.

    python bench/greeting_runner.py operator --kubeconfig K --namespace NS --workers 16 --health-port P
    python bench/greeting_runner.py plain --kubeconfig K --namespace NS --workers 16

``operator`` is the Greeting example operator (its reconciler, unchanged) with the options a benchmark needs: leader
election off, one namespace, ``--workers`` concurrent reconciles, an optional short resync period, and a client
without the client-side limiter (``Unlimited``) so the API server, not a token bucket, sets the pace. Its client and
controller metrics share one registry, served on ``/metrics`` of the health port.

``plain`` is the floor of the runtime's overhead: one LIST, then for every Greeting the same two writes the reconciler
makes (apply the ConfigMap, merge-patch the status), ``--workers`` at a time, no cache, no queue, no watch; it exits
when done: it prints ``done`` and waits for stdin to close, so its CPU time and peak RSS can still be read.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from kanri import runtime as kr
from kanri.runtime.kinds import CONFIG_MAP

# Run as a script, this file sees bench/ on sys.path, not the repository root that holds `examples`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.greeting.operator import GREETING, GreetingReconciler


async def run_operator(args: argparse.Namespace) -> None:
    registry = CollectorRegistry()
    client = await kr.Client.from_kubeconfig(
        args.kubeconfig, rate_limiter=kr.Unlimited(), metrics=kr.ClientMetrics(registry)
    )
    async with client:
        options = kr.ManagerOptions(
            name="greeting-bench",
            leader_election=False,
            namespace=args.namespace,
            health_host="127.0.0.1",
            health_port=args.health_port,
            graceful_shutdown_timeout=5.0,
        )
        manager = kr.Manager(client, options, registry=registry)
        controller_options = kr.ControllerOptions(
            max_concurrent_reconciles=args.workers, resync_period=args.resync_period or None
        )
        controller = kr.Controller(
            "greeting", GreetingReconciler(manager), for_kind=GREETING, options=controller_options
        )
        manager.add(controller.owns(CONFIG_MAP))
        await manager.run()


async def run_plain(args: argparse.Namespace) -> None:
    """What GreetingReconciler writes for a Greeting seen for the first time, with nothing around it."""
    async with await kr.Client.from_kubeconfig(args.kubeconfig, rate_limiter=kr.Unlimited()) as client:
        greetings, _ = await client.list(GREETING, args.namespace)
        pending = iter(greetings)

        async def publish(greeting: dict[str, Any]) -> None:
            meta = greeting["metadata"]
            desired = {
                "metadata": {
                    "name": kr.child_name(meta["name"], "greeting"),
                    "namespace": meta["namespace"],
                    "ownerReferences": [kr.owner_reference(greeting)],
                },
                "data": {"message": greeting["spec"]["message"]},
            }
            await client.apply(CONFIG_MAP, desired, field_manager="greeting-operator")
            conditions: list[dict[str, Any]] = []
            kr.set_condition(conditions, type="Ready", status="True", reason="Published",
                             message="ConfigMap is up to date", observed_generation=meta["generation"])  # fmt: skip
            patch = {"status": {"observedGeneration": meta["generation"], "conditions": conditions}}
            await client.patch_status(GREETING, meta["name"], patch, meta["namespace"])

        async def worker() -> None:
            for greeting in pending:  # one shared iterator: each Greeting goes to exactly one worker
                await publish(greeting)

        async with asyncio.TaskGroup() as group:
            for _ in range(args.workers):
                group.create_task(worker())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["operator", "plain"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--workers", type=int, default=16, help="concurrent reconciles (operator) or requests (plain)")
    parser.add_argument("--resync-period", type=float, default=0.0, help="seconds; 0 disables resyncs (operator)")
    parser.add_argument("--health-port", type=int, default=0, help="/healthz, /readyz, /metrics (operator)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    kr.configure_logging(args.log_level)
    if args.mode == "operator":
        asyncio.run(run_operator(args))
        return
    asyncio.run(run_plain(args))
    # Stay alive (idle) until the benchmark has read our CPU time and peak RSS from /proc and closes stdin.
    print("done", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
