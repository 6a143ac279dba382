"""Authorization is RBAC: an identity outside system:masters can do nothing until a Role and RoleBinding say so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support import eventually, status_message


async def service_account_client(kube_api: k8s.ApiClient, namespace: str, name: str) -> k8s.ApiClient:
    """An API client that authenticates as a new ServiceAccount, with a token from the TokenRequest API."""
    core = k8s.CoreV1Api(kube_api)
    await core.create_namespaced_service_account(namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name)))
    token = await core.create_namespaced_service_account_token(
        name,
        namespace,
        k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600)),
    )
    admin = kube_api.configuration
    configuration = k8s.Configuration(host=admin.host)
    configuration.ssl_ca_cert = admin.ssl_ca_cert
    configuration.api_key = {"BearerToken": f"Bearer {token.status.token}"}
    return k8s.ApiClient(configuration)


@pytest.fixture
async def robot(kube_api: k8s.ApiClient, namespace: str) -> AsyncIterator[k8s.ApiClient]:
    client = await service_account_client(kube_api, namespace, "robot")
    async with client:
        yield client


async def test_service_account_is_denied_until_a_role_binding_grants_access(
    kube_api: k8s.ApiClient, robot: k8s.ApiClient, namespace: str
) -> None:
    as_robot = k8s.CoreV1Api(robot)
    with pytest.raises(ApiException) as denied:
        await as_robot.list_namespaced_config_map(namespace)
    assert denied.value.status == 403
    assert f"system:serviceaccount:{namespace}:robot" in status_message(denied.value)
    assert 'cannot list resource "configmaps"' in status_message(denied.value)

    rbac = k8s.RbacAuthorizationV1Api(kube_api)
    await rbac.create_namespaced_role(
        namespace,
        k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name="configmap-reader"),
            rules=[k8s.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])],
        ),
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="robot-reads-configmaps"),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-reader"),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name="robot", namespace=namespace)],
        ),
    )

    async def allowed() -> bool:
        try:
            await as_robot.list_namespaced_config_map(namespace)
        except ApiException as exc:
            if exc.status == 403:
                return False
            raise
        return True

    # The RBAC authorizer reads from an informer, so the grant takes effect within moments, not instantly.
    await eventually(allowed, timeout=30)

    # The grant is exactly what the Role says: reading, in this namespace, nothing more.
    with pytest.raises(ApiException) as still_denied:
        await as_robot.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="x")))
    assert still_denied.value.status == 403
    with pytest.raises(ApiException) as other_namespace:
        await as_robot.list_namespaced_config_map("default")
    assert other_namespace.value.status == 403
