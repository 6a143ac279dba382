"""The PostgresCluster API on the real API server: the generated CRD installs, the samples are accepted, invalid specs
and forbidden changes are refused with their own messages, defaults are stored, and `kubectl explain` explains."""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from kanri.contract.roles import RESERVED_ROLES
from kanri.local.controlplane import Endpoint
from kanri.postgres.api.v1alpha1 import DEFAULT_MAX_DATA_LOSS_BYTES, PostgresCluster
from kanri.runtime import Client, crd_for
from kanri.runtime.kinds import CRD
from tests.support import eventually, status_message

ROOT = Path(__file__).resolve().parents[2]
INFO = PostgresCluster.resource
MERGE_PATCH = "application/merge-patch+json"
KUBECTL = Path(sys.executable).parent / "kubectl"

# A valid spec the refusal cases below change one thing of.
BASE: dict[str, Any] = {"version": 17, "replicas": 3, "storage": {"size": "10Gi"}}
S3: dict[str, Any] = {
    "endpoint": "https://s3.example.com",
    "bucket": "backups",
    "credentialsSecret": {"name": "s3-keys"},
}


def merged(base: Any, patch: Any) -> Any:
    """``base`` with a JSON merge patch (RFC 7386) applied: dicts merge, None deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out: dict[str, Any] = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def cluster(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": INFO.api_version, "kind": INFO.kind, "metadata": {"name": name}, "spec": spec}


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    """Every PostgresCluster under examples/, as (file:name, object)."""
    found = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == INFO.kind:
                found.append((f"{path.relative_to(ROOT)}:{document['metadata']['name']}", document))
    return found


EXAMPLES = example_documents()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def installed(control_plane: Endpoint) -> AsyncIterator[None]:
    """The generated CRD, applied (idempotently: it is cluster-scoped and stays for the session) and Established."""
    client = await Client.from_kubeconfig(str(control_plane.kubeconfig))
    try:
        await client.apply(CRD, crd_for(PostgresCluster), field_manager="kanri-tests")

        async def established() -> bool:
            crd = await client.get(CRD, INFO.crd_name)
            conditions = {c["type"]: c for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("NonStructuralSchema", {}).get("status") == "True":
                pytest.fail(f"the API server found the schema non-structural: {conditions['NonStructuralSchema']}")
            return bool(conditions.get("Established", {}).get("status") == "True")

        await eventually(established, timeout=30)
        yield
    finally:
        await client.close()


class Clusters:
    """PostgresClusters of one namespace through CustomObjectsApi, with strict field validation (as kubectl)."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.coords = (INFO.group, INFO.version, namespace, INFO.plural)

    async def create(self, body: dict[str, Any], *, field_validation: str = "Strict") -> dict[str, Any]:
        created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            *self.coords, body, field_validation=field_validation
        )
        return created

    async def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.custom.get_namespaced_custom_object(*self.coords, name)
        return found

    # A dict body would otherwise go out as a JSON patch; `_content_type` is accepted but missing from the stubs.
    async def patch(self, name: str, body: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        patch = (
            self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        )
        patched: dict[str, Any] = await patch(
            *self.coords,
            name,
            body,
            field_validation="Strict",
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )
        return patched


async def refusal(write: Any, *, code: int = 422) -> str:
    """The message of the error ``write`` (an awaitable) must end with."""
    with pytest.raises(ApiException) as refused:
        await write
    assert refused.value.status == code, refused.value.body
    return status_message(refused.value)


# --- samples and defaults ---------------------------------------------------------------------------------------


def test_every_sample_is_found() -> None:
    names = [name for name, _ in EXAMPLES]
    assert len(EXAMPLES) >= 6, names
    assert any(name.startswith("examples/postgrescluster.yaml:") for name in names)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(("source", "sample"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
async def test_sample_is_accepted_and_stored_as_written(
    kube_api: k8s.ApiClient, namespace: str, source: str, sample: dict[str, Any]
) -> None:
    clusters = Clusters(kube_api, namespace)
    created = await clusters.create(sample)

    # Nothing the sample says was pruned or changed; the server only added defaults.
    assert merged(created["spec"], sample["spec"]) == created["spec"], source
    # What the server stored reads back into the models.
    PostgresCluster.model_validate(created)


@pytest.mark.usefixtures("installed")
async def test_minimal_spec_gets_every_default(kube_api: k8s.ApiClient, namespace: str) -> None:
    clusters = Clusters(kube_api, namespace)
    created = await clusters.create(cluster("minimal", {"version": 18, "storage": {"size": "1Gi"}}))

    assert created["spec"] == {
        "version": 18,
        "replicas": 1,
        "storage": {"size": "1Gi"},
        "primaryUpdateStrategy": "Switchover",
        "replication": {"mode": "Async"},
        "failover": {"policy": "Automatic", "maxDataLossBytes": DEFAULT_MAX_DATA_LOSS_BYTES, "delaySeconds": 0},
        "deletionPolicy": "Retain",
        "bootstrap": {"initdb": {"database": "app", "owner": "app"}},
    }
    # The models default exactly as the schema does.
    model = PostgresCluster.model_validate({**created, "spec": {"version": 18, "storage": {"size": "1Gi"}}})
    assert model.model_dump(exclude_none=True)["spec"] == created["spec"]


@pytest.mark.usefixtures("installed")
async def test_backup_without_a_repository_is_accepted_for_the_platform_default(
    kube_api: k8s.ApiClient, namespace: str
) -> None:
    clusters = Clusters(kube_api, namespace)
    created = await clusters.create(cluster("plain", merged(BASE, {"backup": {"retentionDays": 14}})))
    assert created["spec"]["backup"]["retentionDays"] == 14
    assert "repository" not in created["spec"]["backup"]


async def test_backup_defaults_turn_the_restore_rehearsal_on(kube_api: k8s.ApiClient, namespace: str) -> None:
    clusters = Clusters(kube_api, namespace)
    spec = merged(BASE, {"backup": {"repository": {"s3": S3}}})
    created = await clusters.create(cluster("db", spec))

    assert created["spec"]["backup"] == {
        "schedule": "0 3 * * *",
        "retentionDays": 7,
        "restoreTest": {"enabled": True, "schedule": "0 5 * * 0"},
        "repository": {
            "s3": {
                **S3,
                "credentialsSecret": {
                    **S3["credentialsSecret"],
                    "accessKeyIdKey": "accessKeyId",
                    "secretAccessKeyKey": "secretAccessKey",
                },
            },
        },
    }


# --- invalid specs ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """A spec the API server must refuse: ``spec`` is merged into BASE; every one of ``messages`` must appear."""

    id: str
    spec: dict[str, Any]
    messages: tuple[str, ...]
    name: str = "db"
    code: int = 422


INVALID = [
    Refused("version-13", {"version": 13}, ("spec.version", "greater than or equal to 14")),
    Refused("version-19", {"version": 19}, ("spec.version", "less than or equal to 18")),
    Refused("replicas-10", {"replicas": 10}, ("spec.replicas", "less than or equal to 9")),
    Refused("replicas-negative", {"replicas": -1}, ("spec.replicas", "greater than or equal to 0")),
    Refused("storage-missing", {"storage": None}, ("spec.storage: Required value",)),
    Refused("storage-tiny", {"storage": {"size": 512}}, ("spec.storage.size", "size must be at least 1Mi")),
    Refused("storage-not-a-quantity", {"storage": {"size": "lots"}}, ("spec.storage.size", "should match")),
    Refused(
        "forbidden-parameters",
        {"postgresql": {"parameters": {"port": "5433", "work_mem": "64MB", "wal_level": "minimal"}}},
        ("spec.postgresql.parameters", 'parameters managed by the operator cannot be set: ["port", "wal_level"]'),
    ),
    Refused(
        "parameter-name-not-lower-case",
        {"postgresql": {"parameters": {"work_mem": "4MB", "Work-Mem": "4MB", "Listen_Addresses": "*"}}},
        ("parameter names must be lower case PostgreSQL names", '["Listen_Addresses", "Work-Mem"]'),
    ),
    Refused("parameter-number", {"postgresql": {"parameters": {"max_connections": 200}}}, ("must be of type string",)),
    Refused(
        "parameters-that-read-files-load-code-or-set-tls",
        {
            "postgresql": {
                "parameters": {
                    "include_if_exists": "/etc/kanri/superuser/password",
                    "include": "/etc/passwd",
                    "include_dir": "/etc",
                    "dynamic_library_path": "/tmp",
                    "ssl": "on",
                    "ssl_passphrase_command": "cat /etc/kanri/app/password",
                    "work_mem": "4MB",
                }
            }
        },
        (
            "spec.postgresql.parameters",
            "read files (include*), load code",
            "configure TLS",
            'cannot be set: ["dynamic_library_path", "include", "include_dir", "include_if_exists", "ssl", '
            '"ssl_passphrase_command"]',
        ),
    ),
    Refused(
        "parameters-that-give-up-data-safety",
        {"postgresql": {"parameters": {"fsync": "off", "zero_damaged_pages": "on", "synchronous_commit": "off"}}},
        ("give up data safety", 'cannot be set: ["fsync", "zero_damaged_pages"]'),
    ),
    Refused(
        "parameters-the-contract-adds-to-the-operator-owned",
        {"postgresql": {"parameters": {"max_wal_senders": "1", "password_encryption": "md5"}}},
        ('parameters managed by the operator cannot be set: ["max_wal_senders", "password_encryption"]',),
    ),
    Refused(
        "preload-a-library-the-image-does-not-ship",
        {
            "postgresql": {
                "parameters": {
                    "shared_preload_libraries": "pg_stat_statements,/tmp/evil.so",
                    "session_preload_libraries": "auto_explain",
                    "local_preload_libraries": "evil",
                }
            }
        },
        (
            "preload parameters may list only libraries",
            "(auth_delay, auto_explain, passwordcheck, pg_prewarm, pg_stat_statements)",
            '["local_preload_libraries", "shared_preload_libraries"]',
        ),
    ),
    Refused(
        "parameter-value-with-nul",
        {"postgresql": {"parameters": {"work_mem": "4MB\u0000", "max_connections": "200"}}},
        ("spec.postgresql.parameters[work_mem]", "a parameter value must be one line without NUL"),
    ),
    Refused(
        "parameter-value-with-newline",
        {"postgresql": {"parameters": {"work_mem": "4MB\ninclude_if_exists = '/etc/kanri/api/token'"}}},
        ("spec.postgresql.parameters[work_mem]", "a line break would start another postgresql.conf entry"),
    ),
    Refused("deletion-policy-unknown", {"deletionPolicy": "Destroy"}, ('Unsupported value: "Destroy"', '"Retain"')),
    Refused("failover-policy-unknown", {"failover": {"policy": "Sometimes"}}, ('Unsupported value: "Sometimes"',)),
    Refused(
        "max-data-loss-negative",
        {"failover": {"maxDataLossBytes": -1}},
        ("spec.failover.maxDataLossBytes", "greater than or equal to 0"),
    ),
    Refused("failover-delay-negative", {"failover": {"delaySeconds": -5}}, ("spec.failover.delaySeconds",)),
    Refused("replication-mode-unknown", {"replication": {"mode": "Semi"}}, ('Unsupported value: "Semi"',)),
    Refused(
        "sync-standbys-not-below-replicas",
        {"replication": {"mode": "Sync", "syncStandbys": 3}},
        ("replication mode Sync with 3 synchronous standby(s) needs at least 4 replicas, not 3",),
    ),
    Refused(
        "sync-single-instance",
        {"replicas": 1, "replication": {"mode": "Sync"}},
        ("replication mode Sync with 1 synchronous standby(s) needs at least 2 replicas, not 1",),
    ),
    Refused(
        "sync-with-local-commits",
        {"replication": {"mode": "Sync"}, "postgresql": {"parameters": {"synchronous_commit": "local"}}},
        ("replication mode Sync needs synchronous_commit on, remote_write or remote_apply",),
    ),
    Refused(
        "sync-standbys-with-async",
        {"replication": {"syncStandbys": 1}},
        ("spec.replication.syncStandbys", "syncStandbys applies to mode Sync only"),
    ),
    Refused(
        "data-durability-with-async",
        {"replication": {"dataDurability": "preferred"}},
        ("spec.replication.dataDurability", "dataDurability applies to mode Sync only"),
    ),
    Refused(
        "data-durability-unknown",
        {"replication": {"mode": "Sync", "dataDurability": "best-effort"}},
        ('Unsupported value: "best-effort"',),
    ),
    Refused(
        "retention-days-zero",
        {"backup": {"retentionDays": 0, "repository": {"s3": S3}}},
        ("spec.backup.retentionDays", "greater than or equal to 1"),
    ),
    Refused(
        "schedule-not-cron",
        {"backup": {"schedule": "every night", "repository": {"s3": S3}}},
        ("spec.backup.schedule", 'not a cron schedule: "every night"'),
    ),
    Refused(
        "schedule-six-fields",
        {"backup": {"schedule": "0 0 3 * * *", "repository": {"s3": S3}}},
        ('not a cron schedule: "0 0 3 * * *"',),
    ),
    Refused(
        "restore-test-schedule-out-of-range",
        {"backup": {"restoreTest": {"schedule": "0 25 * * *"}, "repository": {"s3": S3}}},
        ("spec.backup.restoreTest.schedule", 'not a cron schedule: "0 25 * * *"'),
    ),
    Refused(
        "two-repositories",
        {"backup": {"repository": {"s3": S3, "volume": {"size": "10Gi"}}}},
        ("spec.backup.repository", "needs exactly one of volume or s3"),
    ),
    Refused(
        "volume-repository",
        {"backup": {"repository": {"volume": {"size": "10Gi"}}}},
        ("spec.backup.repository", "repository.volume is not supported by this release: use s3"),
    ),
    Refused(
        "no-repository-kind",
        {"backup": {"repository": {}}},
        ("spec.backup.repository", "needs exactly one of volume or s3"),
    ),
    Refused(
        "s3-without-bucket",
        {"backup": {"repository": {"s3": {**S3, "bucket": None}}}},
        ("spec.backup.repository.s3.bucket: Required value",),
    ),
    Refused(
        "s3-without-credentials",
        {"backup": {"repository": {"s3": {**S3, "credentialsSecret": None}}}},
        ("spec.backup.repository.s3.credentialsSecret: Required value",),
    ),
    Refused(
        "s3-endpoint-not-a-url",
        {"backup": {"repository": {"s3": {**S3, "endpoint": "s3.example.com"}}}},
        ("endpoint must be an http(s) URL", '"s3.example.com"'),
    ),
    Refused(
        "bootstrap-both",
        {"bootstrap": {"initdb": {}, "recovery": {"source": "orders"}}},
        ("spec.bootstrap", "bootstrap needs exactly one of initdb or recovery"),
    ),
    Refused(
        "recovery-target-time-not-rfc3339",
        {"bootstrap": {"recovery": {"source": "orders", "targetTime": "yesterday noon"}}},
        ("spec.bootstrap.recovery.targetTime", "date-time"),
    ),
    Refused(
        "initdb-owner-superuser",
        {"bootstrap": {"initdb": {"owner": "postgres"}}},
        ('owner "postgres" is reserved',),
    ),
    *[
        Refused(
            f"initdb-owner-{role.replace('_', '-')}",
            {"bootstrap": {"initdb": {"owner": role}}},
            ("spec.bootstrap.initdb.owner", f'owner "{role}" is reserved', "streaming_replica replicates"),
        )
        for role in (*RESERVED_ROLES[1:], "pg_monitor")
    ],
    *[
        Refused(
            f"initdb-database-{database.replace('_', '-')}",
            {"bootstrap": {"initdb": {"database": database}}},
            ("spec.bootstrap.initdb.database", f'database "{database}" is reserved', "every pg_ name"),
        )
        for database in ("information_schema", "pg_catalog", "template1")
    ],
    Refused(
        "negative-resources",
        {"resources": {"requests": {"cpu": -1, "memory": "-1Gi"}, "limits": {"cpu": "-500m", "memory": "1Gi"}}},
        (
            "spec.resources.requests",
            'resource quantities may not be negative: ["cpu", "memory"]',
            "spec.resources.limits",
            'resource quantities may not be negative: ["cpu"]',
        ),
    ),
    Refused(
        "label-key-and-value-not-kubernetes-labels",
        {"podTemplate": {"labels": {"a b": "x y", "team": "db", "-x/y": "z", "ok": "-"}}},
        (
            "label keys must be qualified names",
            '["-x/y", "a b"]',
            "spec.podTemplate.labels[a b]",
            "spec.podTemplate.labels[ok]",
            "a label value is at most 63 letters",
        ),
    ),
    Refused(
        "annotation-key-not-a-qualified-name",
        {"podTemplate": {"annotations": {"why not": "a value may be anything", "example.com/ok": "x"}}},
        ("annotation keys must be qualified names", '["why not"]'),
    ),
    Refused(
        "node-selector-not-node-labels",
        {"podTemplate": {"nodeSelector": {"kubernetes.io/os": "linux windows", "zone/": "a"}}},
        ("node label keys must be qualified names", '["zone/"]', "spec.podTemplate.nodeSelector[kubernetes.io/os]"),
    ),
    Refused(
        "affinity-not-an-object",
        {"podTemplate": {"affinity": {"nodeAffinity": "x"}}},
        ("spec.podTemplate.affinity.nodeAffinity", "must be of type object"),
    ),
    Refused(
        "affinity-unknown-operator",
        {
            "podTemplate": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            }
        },
        (
            "spec.podTemplate.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0].operator",
            'Unsupported value: "Near"',
        ),
    ),
    Refused(
        "affinity-in-without-values",
        {
            "podTemplate": {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]},
                            }
                        ]
                    }
                }
            }
        },
        (
            "requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].values",
            "operator In needs at least one value",
        ),
    ),
    Refused(
        "affinity-term-without-topology-key",
        {
            "podTemplate": {
                "affinity": {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 500, "podAffinityTerm": {"labelSelector": {}}}
                        ]
                    }
                }
            }
        },
        (
            "preferredDuringSchedulingIgnoredDuringExecution[0].weight",
            "less than or equal to 100",
            "podAffinityTerm.topologyKey: Required value",
        ),
    ),
    Refused(
        "affinity-unknown-field",
        {"podTemplate": {"affinity": {"nodeAffinity": {}, "podAffinity": {"required": []}}}},
        ('unknown field "spec.podTemplate.affinity.podAffinity.required"',),
        code=400,
    ),
    Refused(
        "topology-spread-out-of-range",
        {
            "podTemplate": {
                "topologySpreadConstraints": [
                    {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"},
                    {"topologyKey": "zone"},
                ]
            }
        },
        (
            "spec.podTemplate.topologySpreadConstraints[0].maxSkew",
            "greater than or equal to 1",
            'Unsupported value: "Sometimes"',
            "spec.podTemplate.topologySpreadConstraints[1].maxSkew: Required value",
        ),
    ),
    Refused(
        "unknown-pod-template-field",
        {"podTemplate": {"containers": [{"name": "sidecar", "image": "busybox"}]}},
        ('unknown field "spec.podTemplate.containers"',),
        code=400,
    ),
    Refused(
        "operator-owned-pod-label",
        {"podTemplate": {"labels": {"kanri.dev/role": "primary", "team": "x", "kanri.dev/cluster": "y"}}},
        ('labels under kanri.dev/ belong to the operator: ["kanri.dev/cluster", "kanri.dev/role"]',),
    ),
    Refused(
        "selector-app-labels",
        {
            "podTemplate": {
                "labels": {"app.kubernetes.io/name": "valkey", "app.kubernetes.io/instance": "x", "team": "x"}
            }
        },
        (
            'labels ["app.kubernetes.io/instance", "app.kubernetes.io/name"] belong to the operator '
            "(its selectors use them)",
        ),
    ),
    Refused(
        "requests-above-limits",
        {
            "resources": {
                "requests": {"memory": "2Gi", "cpu": "2", "ephemeral-storage": "1Gi"},
                "limits": {"memory": "1Gi", "cpu": 1, "ephemeral-storage": "2Gi"},
            }
        },
        ('requests may not exceed limits: ["cpu", "memory"]',),
    ),
    Refused(
        "unknown-resource",
        {"resources": {"limits": {"nvidia.com/gpu": 1, "memory": "1Gi", "gpu": 1}}},
        ('unsupported resource name(s): ["gpu", "nvidia.com/gpu"]',),
    ),
    Refused("approved-version-13", {"upgrade": {"approvedVersion": 13}}, ("spec.upgrade.approvedVersion",)),
    Refused(
        "without-backup-alone",
        {"upgrade": {"withoutBackup": True}},
        ("upgrade.withoutBackup needs upgrade.approvedVersion",),
    ),
    Refused(
        "image-of-another-major",
        {"imageName": "kanri.dev/postgres:16.9"},
        ("spec.imageName", "imageName is not of major 17 (version): its tag must be 17 or 17.<minor>"),
    ),
    Refused(
        "image-by-digest",
        {"imageName": "kanri.dev/postgres@sha256:" + "0" * 64},
        ("spec.imageName", 'not an image of a PostgreSQL release: "kanri.dev/postgres@sha256:'),
    ),
    Refused(
        "image-without-tag", {"imageName": "registry.example:5000/kanri/postgres"}, ("<repository>:<major>.<minor>",)
    ),
    Refused("name-starts-with-digit", {}, ('name "9lives" must start with a letter',), name="9lives"),
    Refused("name-too-long", {}, ("at most 40 characters",), name="a" * 41),
]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("case", INVALID, ids=[case.id for case in INVALID])
async def test_invalid_spec_is_refused_with_its_own_message(
    kube_api: k8s.ApiClient, namespace: str, case: Refused
) -> None:
    clusters = Clusters(kube_api, namespace)
    message = await refusal(clusters.create(cluster(case.name, merged(BASE, case.spec))), code=case.code)
    for expected in case.messages:
        assert expected in message, message


# From the Kubernetes documentation (Assigning Pods to Nodes; Pod Topology Spread Constraints).
DOCS_SCHEDULING: dict[str, Any] = {
    # app.kubernetes.io/name and /instance are the operator's (its selectors use them): refused, see selector-app-labels
    "labels": {"app.kubernetes.io/part-of": "orders", "tier": "", "example.com/owner": "team_a.b-c"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In",
                 "values": ["antarctica-east1", "antarctica-west1"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [
                {"key": "another-node-label-key", "operator": "In", "values": ["another-node-label-value"]}]}}],
        },
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchExpressions": [{"key": "security", "operator": "In", "values": ["S1"]}]},
            "topologyKey": "topology.kubernetes.io/zone"}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
            "labelSelector": {"matchExpressions": [{"key": "security", "operator": "In", "values": ["S2"]}]},
            "topologyKey": "topology.kubernetes.io/zone"}}]},
    },
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"foo": "bar"}}, "matchLabelKeys": ["pod-template-hash"]},
        {"maxSkew": 1, "minDomains": 2, "topologyKey": "node", "whenUnsatisfiable": "ScheduleAnyway",
         "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"},
    ],
}  # fmt: skip


@pytest.mark.usefixtures("installed")
async def test_scheduling_from_the_kubernetes_docs_and_allowed_parameters_are_stored_as_written(
    kube_api: k8s.ApiClient, namespace: str
) -> None:
    clusters = Clusters(kube_api, namespace)
    spec = merged(
        BASE,
        {
            "podTemplate": DOCS_SCHEDULING,
            "resources": {"requests": {"cpu": 0, "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
            "postgresql": {"parameters": {
                "shared_preload_libraries": '"pg_stat_statements", auto_explain', "session_preload_libraries": "",
                "pg_stat_statements.track": "all", "log_min_duration_statement": "250ms",
            }},
            "bootstrap": {"initdb": {"database": "orders", "owner": "orders_owner"}},
        },
    )  # fmt: skip
    created = await clusters.create(cluster("db", spec))
    assert merged(created["spec"], spec) == created["spec"], "nothing pruned or changed"
    PostgresCluster.model_validate(created)


def test_refusal_cases_are_distinct() -> None:
    assert len({case.id for case in INVALID}) == len(INVALID) >= 15
    assert len({case.messages for case in INVALID}) >= 15


@pytest.mark.usefixtures("installed")
async def test_unknown_fields_are_dropped_when_the_client_does_not_ask_for_strict(
    kube_api: k8s.ApiClient, namespace: str
) -> None:
    clusters = Clusters(kube_api, namespace)
    spec = merged(BASE, {"podTemplate": {"containers": [{"name": "x"}], "priorityClassName": "high"}})
    created = await clusters.create(cluster("db", spec), field_validation="Warn")
    assert created["spec"]["podTemplate"] == {"priorityClassName": "high"}, "never stored, never used"


# --- changes ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """An update of an object created from BASE + ``before``: refused with ``messages``, or accepted."""

    id: str
    change: dict[str, Any]
    messages: tuple[str, ...] = ()
    before: dict[str, Any] = field(default_factory=dict)


FORBIDDEN_CHANGES = [
    Change(
        "shrink-storage", {"storage": {"size": "5Gi"}}, ("spec.storage.size", "size may not shrink (from 10Gi to 5Gi)")
    ),
    Change(
        "shrink-storage-across-units", {"storage": {"size": "10000Mi"}}, ("size may not shrink (from 10Gi to 10000Mi)",)
    ),
    Change("downgrade-version", {"version": 16}, ("spec.version", "version may not go down (from 17 to 16)")),
    Change(
        "change-storage-class",
        {"storage": {"storageClassName": "slow"}},
        ("spec.storage.storageClassName", "storageClassName is immutable (was fast)"),
        before={"storage": {"storageClassName": "fast"}},
    ),
    Change(
        "remove-storage-class",
        {"storage": {"storageClassName": None}},
        ("storageClassName cannot be added or removed after creation",),
        before={"storage": {"storageClassName": "fast"}},
    ),
    Change(
        "add-storage-class", {"storage": {"storageClassName": "fast"}}, ("cannot be added or removed after creation",)
    ),
    Change(
        "change-bootstrap",
        {"bootstrap": {"initdb": {"database": "other"}}},
        ("spec.bootstrap", "bootstrap is used only when the cluster is created"),
    ),
    Change(
        "raise-version-but-not-the-image",
        {"version": 18, "upgrade": {"approvedVersion": 18}},
        ("imageName is not of major 18 (version)",),
        before={"imageName": "kanri.dev/postgres:17.10"},
    ),
    Change(
        "scale-sync-cluster-to-one",
        {"replicas": 1},
        ("needs at least 2 replicas, not 1",),
        before={"replication": {"mode": "Sync"}},
    ),
]

ALLOWED_CHANGES = [
    Change("grow-storage-across-units", {"storage": {"size": "10241Mi"}}),
    Change("raise-version-and-approve", {"version": 18, "upgrade": {"approvedVersion": 18}}),
    Change("skip-a-major", {"version": 18}, before={"version": 16}),
    Change("minor-update", {"imageName": "kanri.dev/postgres:17.11"}, before={"imageName": "kanri.dev/postgres:17.10"}),
    Change(
        "raise-version-and-image",
        {"version": 18, "imageName": "registry.example:5000/kanri/postgres:18", "upgrade": {"approvedVersion": 18}},
        before={"imageName": "kanri.dev/postgres:17.10"},
    ),
    Change("hibernate-sync-cluster", {"replicas": 0}, before={"replication": {"mode": "Sync", "syncStandbys": 2}}),
    Change("switch-to-manual-failover", {"failover": {"policy": "Manual", "maxDataLossBytes": 0}}),
    Change("add-backups", {"backup": {"repository": {"s3": S3}}}),
    Change(
        "cron-names-and-macros",
        {
            "backup": {
                "schedule": "0 4 ? JAN-Dec sun",
                "restoreTest": {"schedule": "@weekly"},
                "repository": {"s3": S3},
            }
        },
    ),
    Change(
        "switch-repository",
        {"backup": {"repository": {"s3": S3}}},
        before={"backup": {"repository": {"s3": {**S3, "bucket": "older"}}}},
    ),
    Change("delete-policy", {"deletionPolicy": "Delete"}),
    Change("change-pod-template", {"podTemplate": {"labels": {"team": "b"}, "priorityClassName": "high"}}),
]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("case", FORBIDDEN_CHANGES, ids=[case.id for case in FORBIDDEN_CHANGES])
async def test_forbidden_change_is_refused_and_nothing_is_stored(
    kube_api: k8s.ApiClient, namespace: str, case: Change
) -> None:
    clusters = Clusters(kube_api, namespace)
    created = await clusters.create(cluster("db", merged(BASE, case.before)))

    message = await refusal(clusters.patch("db", {"spec": case.change}))
    for expected in case.messages:
        assert expected in message, message
    assert (await clusters.get("db"))["spec"] == created["spec"]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("case", ALLOWED_CHANGES, ids=[case.id for case in ALLOWED_CHANGES])
async def test_allowed_change_is_stored(kube_api: k8s.ApiClient, namespace: str, case: Change) -> None:
    clusters = Clusters(kube_api, namespace)
    created = await clusters.create(cluster("db", merged(BASE, case.before)))

    updated = await clusters.patch("db", {"spec": case.change})
    assert merged(updated["spec"], case.change) == updated["spec"], "the change is stored as sent (plus defaults)"
    untouched = {key: value for key, value in created["spec"].items() if key not in case.change}
    assert {key: updated["spec"][key] for key in untouched} == untouched


# --- status -----------------------------------------------------------------------------------------------------

STATUS: dict[str, Any] = {
    "phase": "Ready",
    "conditions": [
        {
            "type": t,
            "status": s,
            "reason": r,
            "message": "",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-05-01T12:00:00Z",
        }
        for t, s, r in [
            ("Ready", "True", "AllInstancesReady"),
            ("Progressing", "False", "Converged"),
            ("Degraded", "False", "AllInstancesReady"),
        ]
    ],
    "observedGeneration": 1,
    "currentPrimary": "db-2",
    "timeline": 2,
    "readyReplicas": 3,
    "instances": [
        {
            "name": "db-1",
            "role": "Replica",
            "ready": True,
            "receivedLSN": "0/3000148",
            "replayedLSN": "0/3000148",
            "lagBytes": 0,
        },
        {"name": "db-2", "role": "Primary", "ready": True, "receivedLSN": "0/3000148"},
        {
            "name": "db-3",
            "role": "Replica",
            "ready": True,
            "receivedLSN": "0/3000060",
            "replayedLSN": "0/3000000",
            "lagBytes": 232,
        },
    ],
    "lastFailover": {
        "time": "2026-05-01T11:58:00Z",
        "from": "db-1",
        "to": "db-2",
        "timeline": 2,
        "lsnGapBytes": 0,
        "dataLossPossible": False,
        "reason": "PrimaryUnreachable",
    },
    "backup": {
        "lastSuccessful": "2026-05-01T03:04:10Z",
        "lastFailed": "2026-04-30T03:00:05Z",
        "firstRecoverabilityPoint": "2026-04-24T03:02:00Z",
        "lastRestoreTest": {"time": "2026-04-26T05:09:00Z", "durationSeconds": 540, "result": "Succeeded"},
    },
    "upgrade": {"phase": "Succeeded", "from": 16, "to": 17, "message": "upgraded in 42s"},
}


@pytest.mark.usefixtures("installed")
async def test_status_is_written_through_the_subresource_only(kube_api: k8s.ApiClient, namespace: str) -> None:
    clusters = Clusters(kube_api, namespace)
    created = await clusters.create({**cluster("db", BASE), "status": {"phase": "Ready"}})
    assert "status" not in created, "status is the operator's, written through /status"

    updated = await clusters.patch("db", {"status": STATUS}, status=True)
    assert updated["status"] == STATUS
    assert updated["metadata"]["generation"] == created["metadata"]["generation"]
    PostgresCluster.model_validate(updated)

    message = await refusal(clusters.patch("db", {"status": {"phase": "Sleeping"}}, status=True))
    assert 'Unsupported value: "Sleeping"' in message
    duplicate = {"status": {"instances": [*STATUS["instances"], {"name": "db-1", "role": "Primary"}]}}
    assert "Duplicate value" in await refusal(clusters.patch("db", duplicate, status=True))
    bad_lsn = {"status": {"instances": [{"name": "db-1", "role": "Replica", "receivedLSN": "3000148"}]}}
    assert "status.instances[0].receivedLSN" in await refusal(clusters.patch("db", bad_lsn, status=True))


# --- kubectl ----------------------------------------------------------------------------------------------------


async def kubectl(control_plane: Endpoint, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        f"--kubeconfig={control_plane.kubeconfig}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode()


@pytest.mark.usefixtures("installed")
async def test_kubectl_explain_describes_the_failover_policy(control_plane: Endpoint) -> None:
    async def explained() -> str | None:
        # The CRD reaches the published OpenAPI a few seconds after it is Established.
        code, output = await kubectl(control_plane, "explain", "pgc.spec.failover")
        return output if code == 0 else None

    output = await eventually(explained, timeout=60, interval=1.0)
    text = " ".join(output.split())  # kubectl wraps descriptions at 80 columns
    assert "KIND: PostgresCluster" in text
    assert "FIELD: failover <Object>" in text
    assert "fence it, then promote the replica that received the most WAL" in text
    for name in ("policy <string> enum: Automatic, Manual", "maxDataLossBytes <integer>", "delaySeconds <integer>"):
        assert name in text, output
    assert "The RPO guard, in bytes of WAL. Default 16777216" in text

    code, output = await kubectl(control_plane, "explain", "pgc.spec.postgresql.parameters")
    assert code == 0, output
    assert "are refused by the API server with a message naming them" in " ".join(output.split())


@pytest.mark.usefixtures("installed")
async def test_kubectl_get_shows_the_printer_columns_by_short_name_and_category(
    kube_api: k8s.ApiClient, control_plane: Endpoint, namespace: str
) -> None:
    clusters = Clusters(kube_api, namespace)
    await clusters.create(cluster("db", BASE))
    await clusters.patch(
        "db", {"status": {"phase": "Ready", "readyReplicas": 3, "currentPrimary": "db-1"}}, status=True
    )

    for resource in ("pgc", "kanri"):
        code, output = await kubectl(control_plane, "get", resource, "-n", namespace)
        assert code == 0, output
        header, row = output.splitlines()[:2]
        assert header.split() == ["NAME", "VERSION", "REPLICAS", "READY", "PRIMARY", "PHASE", "AGE"]
        # Through a category, kubectl may prefix names with their type.
        assert row.split()[0] in ("db", f"{INFO.singular}.{INFO.group}/db"), output
        assert row.split()[1:6] == ["17", "3", "3", "db-1", "Ready"]
