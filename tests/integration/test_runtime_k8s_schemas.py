"""Kubernetes' own types in a custom resource, on the real API server: the stored definitions are the server's own,
a CRD embedding them installs, and the server applies their structure checks to the custom resource. The built-in
kinds of ``kanri.runtime.kinds`` are all served."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import Field

from kanri.runtime import ApiError, Client, CustomResource, Kind, KubeModel, install_crd
from kanri.runtime import kinds as builtin
from kanri.runtime._k8s_schemas import from_server, stored
from kanri.runtime.kinds import JOB
from kanri.runtime.schemas import JobTemplateSpec, ObjectReference


class RunSpec(KubeModel):
    job_template: JobTemplateSpec
    """The Job this run starts."""
    target: ObjectReference | None = None


class Run(CustomResource, group="schemas.kanri.dev", version="v1", kind="Run", plural="runs"):
    spec: RunSpec
    status: dict[str, Any] | None = Field(default=None)


RUN = Run.resource.api_kind


def job_template(container: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "run"}},
        "spec": {"template": {"metadata": {"labels": {"app": "run"}},
                              "spec": {"restartPolicy": "Never", "containers": [container]}}},
    }  # fmt: skip


async def test_the_stored_definitions_are_the_ones_the_pinned_api_server_serves(client: Client) -> None:
    assert await from_server(client) == stored(), (
        "k8s_openapi.json is stale: python -m kanri.runtime._k8s_schemas --kubeconfig <the control plane's>"
    )


async def test_a_crd_embedding_core_types_installs_and_the_server_checks_their_structure(
    client: Client, namespace: str
) -> None:
    await install_crd(client, Run, field_manager="kanri-tests")
    container = {"name": "work", "image": "kanri.dev/test/work:1", "ports": [{"containerPort": 80}]}
    run = {"metadata": {"name": "ok", "namespace": namespace},
           "spec": {"jobTemplate": job_template(container),
                    "target": {"kind": "ConfigMap", "name": "x", "namespace": namespace}}}  # fmt: skip
    created = await client.create(RUN, run)
    template = created["spec"]["jobTemplate"]
    assert template["metadata"]["labels"] == {"app": "run"}  # nested metadata is not pruned
    (port,) = template["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert port == {"containerPort": 80, "protocol": "TCP"}  # the schema's default, as a pod would get it

    # The embedded template makes a Job the API server accepts as it is.
    job = {"metadata": {"name": "from-run", "namespace": namespace, **template["metadata"]}, "spec": template["spec"]}
    assert (await client.create(JOB, job))["metadata"]["name"] == "from-run"

    cases: list[tuple[dict[str, Any], str]] = [
        ({"image": "no-name"}, "name: Required value"),
        ({"name": "w", "image": "i", "imagePullPolicy": "Sometimes"}, "imagePullPolicy: Unsupported value"),
        ({"name": "w", "image": "i", "resources": {"limits": {"cpu": "lots"}}}, "cpu"),
    ]
    for broken, complaint in cases:
        bad = {"metadata": {"name": "bad", "namespace": namespace}, "spec": {"jobTemplate": job_template(broken)}}
        with pytest.raises(ApiError) as refused:
            await client.create(RUN, bad)
        assert refused.value.status == 422
        assert complaint in refused.value.message


CREATE_ONLY = frozenset({"TOKEN_REVIEW", "SUBJECT_ACCESS_REVIEW"})
"""Kinds the API server only creates (a review answered in the response): they are not listed."""


async def test_every_builtin_kind_is_served_at_its_path(client: Client) -> None:
    constants = [getattr(builtin, name) for name in builtin.__all__]
    assert all(isinstance(kind, Kind) for kind in constants)
    assert {"JOB", "CRON_JOB", "DAEMON_SET", "REPLICA_SET", "INGRESS", "NETWORK_POLICY"} <= set(builtin.__all__)
    assert set(builtin.__all__) >= CREATE_ONLY
    for name in builtin.__all__:
        if name in CREATE_ONLY:
            continue
        # One page of one item: served is the question, not the objects (a paginated list would fetch every one,
        # one request each — in a full run that is every Event and ClusterRole the suite made).
        page = await client.get_path(getattr(builtin, name).path(None) + "?limit=1")
        assert isinstance(page.get("items"), list), name
    # the reviews: served at their paths when a create is answered with a verdict
    token = await client.create(builtin.TOKEN_REVIEW, {"spec": {"token": "not-a-token"}})
    assert (token.get("status") or {}).get("authenticated") is not True, token
    access = await client.create(builtin.SUBJECT_ACCESS_REVIEW, {"spec": {
        "user": "nobody", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})  # fmt: skip
    assert access["status"]["allowed"] is False, access
