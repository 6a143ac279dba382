"""Operator upgrades carry their CRDs, on the real kube-apiserver (kanri.runtime.upgrade_crds, docs/helm.md).

A CRD of revision N is installed the way Helm's ``crds/`` does (a plain create, no stamp); operator N+1 replaces it
with its own before it serves (a property added, one dropped: the replace leaves nothing of N behind); operator N
then refuses to run against N+1's CRD and changes nothing; an older operator whose CRD equals the installed one runs;
two replicas upgrading at once both succeed.
The CRDs use a group of this module's own; the last test runs the PostgreSQL operator's wiring against the session's
PostgresCluster CRD.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.postgres.operator import OperatorOptions, build_manager, operator_crds
from kanri.runtime import Client, CrdDowngradeRefused, Kind, upgrade_crds
from kanri.runtime._crd_upgrade import DIGEST_ANNOTATION, VERSION_ANNOTATION, crd_digest
from kanri.runtime.kinds import CRD, NAMESPACE
from tests.postgres_support import install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]
GROUP = "crdupgrade.kanri.dev"
NAME = f"widgets.{GROUP}"
WIDGET = Kind(f"{GROUP}/v1", "Widget", "widgets")


def widget_crd(properties: Obj) -> Obj:
    """The Widget CRD whose spec has ``properties``; the API server prunes every other field."""
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


# Revision N knows size and legacy; N+1 adds color and drops legacy.
CRD_N = widget_crd({"size": {"type": "integer"}, "legacy": {"type": "string"}})
CRD_N1 = widget_crd({"size": {"type": "integer"}, "color": {"type": "string"}})


def spec_properties(crd: Obj) -> set[str]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return set(schema["properties"]["spec"]["properties"])


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        yield c


async def test_the_newer_operator_replaces_an_older_crd_before_it_serves(client: Client) -> None:
    await client.create(CRD, CRD_N)  # what `helm install` does with crds/: no stamp, Helm's field manager
    (done,) = await upgrade_crds(client, [CRD_N1], operator_version="0.2.0")
    assert (done.action, done.installed_version) == ("upgraded", None)
    crd = await client.get(CRD, NAME)
    annotations = crd["metadata"]["annotations"]
    assert annotations[VERSION_ANNOTATION] == "0.2.0"
    assert annotations[DIGEST_ANNOTATION] == crd_digest(CRD_N1)
    assert spec_properties(crd) == {"size", "color"}, "the replace must leave none of revision N's fields"
    # The new field is served at once (before the upgrade the API server pruned it).
    namespace = f"crdupgrade-{secrets.token_hex(3)}"
    await client.create(NAMESPACE, {"metadata": {"name": namespace}})
    attempts = iter(range(1000))

    async def kept() -> Obj | None:
        # The API server switches a CRD's schema shortly after the write (its handler reloads on the watch event);
        # a create prunes what the schema in force does not declare.
        name = f"w{next(attempts)}"
        body = {"metadata": {"name": name, "namespace": namespace}, "spec": {"size": 1, "color": "blue", "legacy": "x"}}
        spec: Obj = (await client.create(WIDGET, body))["spec"]
        return spec if "color" in spec else None

    assert await eventually(kept, timeout=30) == {"size": 1, "color": "blue"}
    # Idempotent: the same operator again writes nothing.
    (again,) = await upgrade_crds(client, [CRD_N1], operator_version="0.2.0")
    assert again.action == "unchanged"
    assert (await client.get(CRD, NAME))["metadata"]["resourceVersion"] == crd["metadata"]["resourceVersion"]


async def test_the_older_operator_refuses_a_newer_different_crd_and_changes_nothing(client: Client) -> None:
    before = await client.get(CRD, NAME)
    assert before["metadata"]["annotations"][VERSION_ANNOTATION] == "0.2.0"  # left by the test above
    with pytest.raises(CrdDowngradeRefused) as refused:
        await upgrade_crds(client, [CRD_N], operator_version="0.1.9")
    message = str(refused.value)
    assert f"CRD {NAME} was written by kanri operator 0.2.0; this operator is 0.1.9" in message, message
    after = await client.get(CRD, NAME)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert spec_properties(after) == {"size", "color"}


async def test_an_older_operator_carrying_the_same_crd_runs_and_writes_nothing(client: Client) -> None:
    # A later release that did not change the CRD wrote it; rolling back to 0.2.0 is safe and allowed.
    (newer,) = await upgrade_crds(client, [CRD_N1], operator_version="0.2.1")
    assert (newer.action, newer.installed_version) == ("upgraded", "0.2.0")  # same spec, newer stamp
    stamped = await client.get(CRD, NAME)
    (older,) = await upgrade_crds(client, [CRD_N1], operator_version="0.2.0")
    assert (older.action, older.installed_version) == ("newer-kept", "0.2.1")
    assert (await client.get(CRD, NAME))["metadata"]["resourceVersion"] == stamped["metadata"]["resourceVersion"]
    # Two replicas of a newer operator starting at once: both read the same CRD; one replaces it, the other's replace
    # conflicts, reads again and finds it done.
    results = await asyncio.gather(*(upgrade_crds(client, [CRD_N], operator_version="0.3.0") for _ in range(2)))
    assert sorted(r.action for (r,) in results) in (["unchanged", "upgraded"], ["upgraded", "upgraded"]), results
    final = await client.get(CRD, NAME)
    assert final["metadata"]["annotations"][VERSION_ANNOTATION] == "0.3.0"
    assert spec_properties(final) == {"size", "legacy"}
    await client.delete(CRD, NAME)


async def test_the_postgres_operator_upgrades_its_crds_first_and_an_older_one_does_not_start(client: Client) -> None:
    await install_postgres_crd(client)
    options = OperatorOptions(upgrade_crds=True, leader_election=False, health_port=None)
    manager = build_manager(client, options)
    manager.stop()  # the CRDs come before anything else; then the manager starts and stops at once
    await manager.run(handle_signals=False)
    for crd in operator_crds():
        stamped = await client.get(CRD, crd["metadata"]["name"])
        assert stamped["metadata"]["annotations"][DIGEST_ANNOTATION] == crd_digest(crd)
    # A newer operator with another schema wrote the cluster CRD: this one refuses before it watches anything.
    name = operator_crds()[0]["metadata"]["name"]
    newer = {VERSION_ANNOTATION: "99.0.0", DIGEST_ANNOTATION: "0" * 16}
    await client.patch(CRD, name, {"metadata": {"annotations": newer}})
    try:
        with pytest.raises(CrdDowngradeRefused, match=r"operator 99\.0\.0; this operator is 0\.1\.0"):
            await build_manager(client, options).run(handle_signals=False)
    finally:
        unstamped = {VERSION_ANNOTATION: None, DIGEST_ANNOTATION: None}
        await client.patch(CRD, name, {"metadata": {"annotations": unstamped}})
