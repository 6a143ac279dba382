"""Resource quantities as exact numbers: what a Pod requests, what a Node offers, what is left.

Quantities are parsed with :func:`kanri.runtime.parse_quantity` into ``Decimal`` (``"500m"`` -> ``0.5``), so sums
and comparisons are exact, as the scheduler's integer milli-units are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from kanri.runtime import parse_quantity

Obj = dict[str, Any]
Resources = dict[str, Decimal]


def parse_resources(raw: Mapping[str, str | int] | None) -> Resources:
    """A ``ResourceList`` (``{"cpu": "500m", "memory": "1Gi"}``) as exact numbers."""
    return {name: parse_quantity(value) for name, value in (raw or {}).items()}


def add(*lists: Mapping[str, Decimal]) -> Resources:
    total: Resources = {}
    for resources in lists:
        for name, value in resources.items():
            total[name] = total.get(name, Decimal(0)) + value
    return total


def maximum(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Resources:
    return {name: max(a.get(name, Decimal(0)), b.get(name, Decimal(0))) for name in {*a, *b}}


def _requests(container: Obj) -> Resources:
    return parse_resources((container.get("resources") or {}).get("requests"))


def pod_requests(pod: Obj) -> Resources:
    """What the scheduler reserves for ``pod``, following the kubelet's rule for init containers.

    App containers and sidecars (init containers with ``restartPolicy: Always``) run together, so they add up. A
    regular init container runs alone, next to the sidecars started before it, so it only raises the total when it
    alone asks for more. Pod-level ``spec.resources.requests`` replace the container sum for the resources they
    name; ``spec.overhead`` (from a RuntimeClass) is added on top.
    """
    spec = pod.get("spec") or {}
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in spec.get("initContainers") or ():
        if container.get("restartPolicy") == "Always":
            sidecars = add(sidecars, _requests(container))
        else:
            init_peak = maximum(init_peak, add(_requests(container), sidecars))
    running = add(sidecars, *(_requests(c) for c in spec.get("containers") or ()))
    total = maximum(running, init_peak)
    total.update(parse_resources((spec.get("resources") or {}).get("requests")))
    return add(total, parse_resources(spec.get("overhead")))


def insufficient(
    requested: Mapping[str, Decimal], allocatable: Mapping[str, Decimal], used: Mapping[str, Decimal]
) -> list[str]:
    """Names of the resources ``requested`` asks for (non-zero) that ``allocatable - used`` cannot cover, sorted.

    A resource the node does not offer at all (an extended resource such as ``nvidia.com/gpu``) counts as zero.
    """
    short = []
    for name, amount in requested.items():
        if amount > 0 and amount > allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0)):
            short.append(name)
    return sorted(short)


def sum_requests(pods: Iterable[Obj]) -> Resources:
    return add(*(pod_requests(pod) for pod in pods))


def memory_total_kib(meminfo: str) -> int:
    """``MemTotal`` from the text of ``/proc/meminfo`` (kB there means KiB)."""
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            return int(value.split()[0])
    raise ValueError("no MemTotal line in /proc/meminfo")
