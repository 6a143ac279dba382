"""The real ``helm`` (built by ``make helm`` into .build/bin) and the chart in deploy/helm/kanri, for the tests."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kanri.runtime import Kind

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "kanri"
HELM = ROOT / ".build" / "bin" / "helm"

Obj = dict[str, Any]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; a missing binary fails the test (it is part of `make setup`, so CI always has it)."""
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make helm` (part of `make setup`)")
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def template_text(*values: str, release: str = "kanri", namespace: str = "kanri-system") -> str:
    """``helm template`` of the chart with ``--set`` values, as text."""
    sets = [arg for value in values for arg in ("--set", value)]
    return helm("template", release, str(CHART), "--namespace", namespace, *sets).stdout


def template(*values: str, release: str = "kanri", namespace: str = "kanri-system") -> list[Obj]:
    """``helm template`` of the chart with ``--set`` values, as objects."""
    return [d for d in yaml.safe_load_all(template_text(*values, release=release, namespace=namespace)) if d]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` called ``name`` in a render."""
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


async def helm_async(*args: str, home: Path, timeout: float = 360) -> str:
    """Run helm without blocking the event loop (the local node's kubelet runs on it); its state lives in ``home``.
    Returns stdout; a non-zero exit fails with helm's stderr."""
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make helm` (part of `make setup`)")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    process = await asyncio.create_subprocess_exec(
        str(HELM), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"helm {' '.join(args)} did not finish within {timeout:.0f} s") from None
    if process.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {process.returncode}:\n{stderr.decode()}")
    return stdout.decode()


Needed = dict[tuple[Kind, str], frozenset[str]]
"""An operator's rights: (kind, subresource) -> verbs."""
Grant = tuple[str, str, str]
"""One RBAC grant: (API group, resource[/subresource], verb)."""


def as_grants(needed: Needed) -> set[Grant]:
    """``needed`` as the grants a ClusterRole must hold."""
    return {
        (kind.group, kind.plural + (f"/{sub}" if sub else ""), verb)
        for (kind, sub), verbs in needed.items() for verb in verbs
    }  # fmt: skip


def rule_grants(rules: list[Obj]) -> set[Grant]:
    """The grants a rendered Role's ``rules`` hold."""
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _pod_log_tails(node_dir: Path, pod_glob: str) -> str:
    files = sorted(node_dir.glob(f"*/pods/{pod_glob}/*/*.log"))
    return "\n".join(f"--- {f}\n{f.read_text(errors='replace')[-12000:]}" for f in files)


async def pod_log_tails(node_dir: Path, pod_glob: str) -> str:
    """The end of each container log of the home-made node's pods matching ``pod_glob`` under ``node_dir`` (the
    ``node`` fixture's data dir): what a failed chart install prints, since ``kubectl logs`` cannot reach the test
    network's kubelet."""
    return await asyncio.to_thread(_pod_log_tails, node_dir, pod_glob)


# ``client.<method>(KIND, …)`` → (subresource, verbs).
CLIENT_VERBS: dict[str, tuple[str, frozenset[str]]] = {
    "create": ("", frozenset({"create"})),
    "apply": ("", frozenset({"create", "patch"})),
    "patch": ("", frozenset({"patch"})),
    "patch_status": ("status", frozenset({"patch"})),
    "replace": ("", frozenset({"update"})),
    "replace_status": ("status", frozenset({"update"})),
    "delete": ("", frozenset({"delete"})),
    "get": ("", frozenset({"get"})),
}
# ``ctx.children.<method>(KIND, …)`` (kit's child writer): apply is a server-side apply, then a patch when the apply
# dropped a field; create_once creates; delete deletes.
CHILDREN_VERBS: dict[str, frozenset[str]] = {
    "apply": frozenset({"create", "patch"}),
    "create_once": frozenset({"create"}),
    "delete": frozenset({"delete"}),
}


def _is(node: ast.expr, *names: str) -> bool:
    # client.x, ctx.client.x, self.client.x, ctx.children.x
    return (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute) and node.attr in names)


def writes_in(src: Path, kinds: dict[str, Kind], *, skip: str | None = None) -> tuple[Needed, list[str]]:
    """(Every write an operator's code under ``src`` sends through a client or kit's child writer, per kind, read
    from the code itself; calls whose kind is not one of the constants ``kinds`` names). A folder named ``skip``
    (an in-pod agent with an identity of its own) is left out."""
    found: Needed = {}
    generic: list[str] = []
    for path in sorted(src.rglob("*.py")):
        if skip is not None and skip in path.relative_to(src).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args or not isinstance(node.func, ast.Attribute):
                continue
            func = node.func
            verbs: tuple[str, frozenset[str]] | None = None
            if func.attr in CLIENT_VERBS and _is(func.value, "client", "_client"):
                verbs = CLIENT_VERBS[func.attr]
            elif func.attr in CHILDREN_VERBS and _is(func.value, "children"):
                verbs = ("", CHILDREN_VERBS[func.attr])
            if verbs is None:
                continue
            arg = node.args[0]
            kind = kinds.get(arg.id) if isinstance(arg, ast.Name) else None
            if kind is None:
                generic.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                continue
            found[(kind, verbs[0])] = found.get((kind, verbs[0]), frozenset()) | verbs[1]
    return found, generic
