"""A CRD generated from pydantic models is accepted by the real API server and behaves as the models say:
defaults, CEL rules (with our messages), the status subresource, list-map conditions and printer columns."""

from __future__ import annotations

import enum
import secrets
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import Field

from kanri.runtime._conditions import set_condition
from kanri.runtime._crd import CustomResource, PrinterColumn, crd_for
from kanri.runtime._model import Conditions, IntOrString, KubeModel, Quantity, cel
from tests.support import eventually, is_gone, status_message

GROUP = "gen.kanri.dev"
VERSION = "v1alpha1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
MERGE_PATCH = "application/merge-patch+json"


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


class Backup(KubeModel):
    """When and how long to keep backups."""

    schedule: str = "0 3 * * *"
    """Cron schedule of base backups."""
    retention_days: Annotated[int, Field(ge=1, le=365)] = 7
    """Days to keep a backup."""


class Storage(KubeModel):
    """The data volume."""

    size: Annotated[
        Quantity,
        cel(
            "quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",
            message_expression="'size may not shrink (from ' + string(oldSelf) + ' to ' + string(self) + ')'",
            reason="FieldValueForbidden",
        ),
    ] = "1Gi"
    """Size of the volume; it may grow but never shrink."""
    storage_class: Annotated[str, cel("self == oldSelf", "storageClass is immutable")] | None = None
    """StorageClass of the volume; fixed once set."""


class SampleSpec(
    KubeModel,
    validations=[
        cel("!has(self.maxReplicas) || self.replicas <= self.maxReplicas", "replicas must not exceed maxReplicas")
    ],
):
    """What the user wants."""

    image: str
    """Container image."""
    replicas: Annotated[int, Field(ge=0)] = 1
    """Number of instances."""
    max_replicas: int | None = None
    """Upper bound for replicas."""
    mode: Literal["fast", "safe"] = "safe"
    """Durability trade-off."""
    storage: Storage = Storage()
    backup: Backup | None = None
    affinity: dict[str, Any] | None = None
    """Kubernetes affinity, passed through as is."""
    labels: dict[str, str] = Field(default_factory=dict)
    port: IntOrString = 5432
    tier: Tier = Tier.GOLD
    tags: set[str] = Field(default_factory=set)
    ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5
    limit: int | None = 5
    """Nullable: an explicit null is kept, absence gets the default."""
    started: datetime | None = None
    extra: Any = None


class SampleStatus(KubeModel):
    """What the operator observed."""

    phase: str | None = None
    """Lifecycle phase."""
    ready_replicas: int = 0
    """Instances ready to serve."""
    conditions: Conditions = Field(default_factory=list)
    """Current state, one entry per condition type."""


def sample_resource(suffix: str) -> type[CustomResource]:
    """A fresh kind per test, so tests never share (or wait for the removal of) a CRD."""

    class Sample(
        CustomResource,
        group=GROUP,
        version=VERSION,
        kind=f"Sample{suffix}",
        plural=f"samples{suffix}",
        short_names=(f"smp{suffix}",),
        categories=("kanri-test",),
        printer_columns=(
            PrinterColumn("Replicas", ".spec.replicas", type="integer"),
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Size", ".spec.storage.size", priority=1),
        ),
        validations=[cel("self.metadata.name.size() <= 40", "name must be at most 40 characters")],
    ):
        """A sample resource exercising every schema feature."""

        spec: SampleSpec
        status: SampleStatus | None = None

    return Sample


@pytest_asyncio.fixture(loop_scope="session")
async def sample(kube_api: k8s.ApiClient) -> AsyncIterator[type[CustomResource]]:
    """Install the generated CRD and wait until the API server has accepted and established it."""
    resource = sample_resource(secrets.token_hex(3))
    ext = k8s.ApiextensionsV1Api(kube_api)
    name = resource.resource.crd_name
    # The client sends a plain dict unchanged; the typed signature only lists its generated model.
    await ext.create_custom_resource_definition(crd_for(resource))  # type: ignore[arg-type]

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(name)
        conditions = {c.type: c for c in crd.status.conditions or []}
        if (refused := conditions.get("NonStructuralSchema")) is not None and refused.status == "True":
            pytest.fail(f"the API server found the schema non-structural: {refused.message}")
        return "Established" in conditions and conditions["Established"].status == "True"

    await eventually(established, timeout=30)
    try:
        yield resource
    finally:
        await ext.delete_custom_resource_definition(name)
        await eventually(lambda: is_gone(lambda: ext.read_custom_resource_definition(name)), timeout=60)


def new(resource: type[CustomResource], name: str, **spec: Any) -> dict[str, Any]:
    info = resource.resource
    return {"apiVersion": info.api_version, "kind": info.kind, "metadata": {"name": name}, "spec": spec}


class Objects:
    """CustomObjectsApi bound to one resource and namespace."""

    def __init__(self, api: k8s.ApiClient, resource: type[CustomResource], namespace: str) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.coords = (resource.resource.group, resource.resource.version, namespace, resource.resource.plural)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await self.custom.create_namespaced_custom_object(*self.coords, body)
        return created

    # A dict body would otherwise go out as a JSON patch; `_content_type` is accepted but missing from the stubs.
    async def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = await self.custom.patch_namespaced_custom_object(
            *self.coords,
            name,
            body,
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )
        return patched

    async def patch_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = await self.custom.patch_namespaced_custom_object_status(
            *self.coords,
            name,
            body,
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )
        return patched

    async def refused(self, write: Awaitable[object]) -> str:
        """The message of the 422 that ``write`` (an awaitable) must end with."""
        with pytest.raises(ApiException) as refused:
            await write
        assert refused.value.status == 422, refused.value.body
        return status_message(refused.value)


async def test_minimal_object_gets_the_model_defaults(
    kube_api: k8s.ApiClient, namespace: str, sample: type[CustomResource]
) -> None:
    objects = Objects(kube_api, sample, namespace)
    created = await objects.create(new(sample, "minimal", image="postgres:18"))

    assert created["spec"] == {
        "image": "postgres:18",
        "replicas": 1,
        "mode": "safe",
        "storage": {"size": "1Gi"},
        "port": 5432,
        "tier": "gold",
        "ratio": 0.5,
        "limit": 5,
    }, "defaults come from the models; None and default_factory fields stay absent"
    # What the server stored reads back into the model.
    model = sample.model_validate(created)
    assert model.model_dump(exclude_none=True)["spec"]["storage"] == {"size": "1Gi"}

    # A nullable field keeps an explicit null instead of taking its default.
    explicit = await objects.create(new(sample, "explicit", image="x", limit=None, extra={"any": ["thing"]}))
    assert explicit["spec"]["limit"] is None
    assert explicit["spec"]["extra"] == {"any": ["thing"]}


async def test_schema_refuses_what_the_models_refuse(
    kube_api: k8s.ApiClient, namespace: str, sample: type[CustomResource]
) -> None:
    objects = Objects(kube_api, sample, namespace)
    assert "spec.image: Required value" in await objects.refused(objects.create(new(sample, "a")))
    assert "Unsupported value" in await objects.refused(objects.create(new(sample, "b", image="x", mode="yolo")))
    assert "Duplicate value" in await objects.refused(objects.create(new(sample, "f", image="x", tags=["a", "a"])))
    assert "spec.ratio" in await objects.refused(objects.create(new(sample, "g", image="x", ratio=1)))
    bad_size = new(sample, "c", image="x", storage={"size": "lots"})
    assert "spec.storage.size" in await objects.refused(objects.create(bad_size))
    too_many = new(sample, "d", image="x", replicas=3, maxReplicas=2)
    assert "replicas must not exceed maxReplicas" in await objects.refused(objects.create(too_many))
    long_name = new(sample, "x" * 41, image="x")
    assert "name must be at most 40 characters" in await objects.refused(objects.create(long_name))

    # Free-form fields keep what they are given; typed ones prune unknown fields.
    free = new(sample, "e", image="x", affinity={"nodeAffinity": {"anything": [1, 2]}}, unknown="dropped")
    created = await objects.create(free)
    assert created["spec"]["affinity"] == {"nodeAffinity": {"anything": [1, 2]}}
    assert "unknown" not in created["spec"]


async def test_transition_rules_refuse_shrinking_and_changing_immutable_fields(
    kube_api: k8s.ApiClient, namespace: str, sample: type[CustomResource]
) -> None:
    objects = Objects(kube_api, sample, namespace)
    # A plain number is a valid quantity too; string() in the rule handles both forms.
    await objects.create(new(sample, "db", image="x", storage={"size": 1073741824, "storageClass": "fast"}))

    grown = await objects.patch("db", {"spec": {"storage": {"size": "20000Mi"}}})
    assert grown["spec"]["storage"]["size"] == "20000Mi"

    message = await objects.refused(objects.patch("db", {"spec": {"storage": {"size": "19Gi"}}}))
    assert "spec.storage.size" in message
    assert "size may not shrink (from 20000Mi to 19Gi)" in message

    message = await objects.refused(objects.patch("db", {"spec": {"storage": {"storageClass": "slow"}}}))
    assert "spec.storage.storageClass" in message
    assert "storageClass is immutable" in message


async def test_status_subresource_takes_list_map_conditions(
    kube_api: k8s.ApiClient, namespace: str, sample: type[CustomResource]
) -> None:
    objects = Objects(kube_api, sample, namespace)
    created = await objects.create({**new(sample, "db", image="x"), "status": {"phase": "Ignored"}})
    assert "status" not in created, "status is written through /status only"

    conditions: list[dict[str, Any]] = []
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    set_condition(conditions, type="Ready", status=True, reason="Up", message="", observed_generation=1, now=now)
    updated = await objects.patch_status("db", {"status": {"phase": "Running", "conditions": conditions}})
    assert updated["status"] == {
        "phase": "Running",
        "readyReplicas": 0,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "observedGeneration": 1,
                "lastTransitionTime": "2026-05-01T12:00:00Z",
                "reason": "Up",
                "message": "",
            }
        ],
    }
    assert updated["metadata"]["generation"] == created["metadata"]["generation"]

    duplicated = {"status": {"conditions": [*conditions, {**conditions[0], "status": "False"}]}}
    assert "Duplicate value" in await objects.refused(objects.patch_status("db", duplicated))


async def test_printer_columns_come_back_in_a_table(
    kube_api: k8s.ApiClient, namespace: str, sample: type[CustomResource]
) -> None:
    objects = Objects(kube_api, sample, namespace)
    await objects.create(new(sample, "db", image="x", replicas=2, storage={"size": "5Gi"}))
    conditions: list[dict[str, Any]] = []
    set_condition(
        conditions,
        type="Ready",
        status=False,
        reason="Starting",
        message="",
        observed_generation=1,
        now=datetime.now(UTC),
    )
    await objects.patch_status("db", {"status": {"phase": "Provisioning", "conditions": conditions}})

    info = sample.resource
    response = await kube_api.call_api(
        f"/apis/{info.api_version}/namespaces/{namespace}/{info.plural}",
        "GET",
        header_params={"Accept": TABLE},
        _preload_content=False,
    )
    table = await response.json()
    assert table["kind"] == "Table"
    columns = [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [
        ("Name", "string", 0),
        ("Replicas", "integer", 0),
        ("Ready", "string", 0),
        ("Phase", "string", 0),
        ("Size", "string", 1),
        ("Age", "date", 0),
    ]
    descriptions = {c["name"]: c["description"] for c in table["columnDefinitions"]}
    assert descriptions["Replicas"] == "Number of instances.", "taken from the field's docstring"
    (row,) = table["rows"]
    assert row["cells"][:5] == ["db", 2, "False", "Provisioning", "5Gi"]


async def test_short_name_and_category_are_served_in_discovery(
    kube_api: k8s.ApiClient, sample: type[CustomResource]
) -> None:
    info = sample.resource
    listing = await k8s.CustomObjectsApi(kube_api).get_api_resources(info.group, info.version)
    (found,) = [r for r in listing.resources if r.name == info.plural]
    assert found.short_names == list(info.short_names)
    assert found.categories == ["kanri-test"]
    assert found.kind == info.kind
