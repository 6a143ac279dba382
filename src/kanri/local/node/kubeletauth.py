"""Who may use a node's kubelet API: authentication and authorization as a kubelet in Webhook mode does them.

Authentication (``pkg/kubelet/server/auth.go`` with x509 + webhook token authenticators): a client certificate
signed by the cluster CA (the TLS layer checked the signature; CN is the user, O the groups), else a bearer token
checked with a ``TokenReview``, else 401. Authorization: the API server's own user, ``kube-apiserver-kubelet-client``
(kubeadm binds it to ``system:kubelet-api-admin``; the node hard-wires that grant), is allowed; anyone else needs a
``SubjectAccessReview`` allowing ``<verb>`` on ``nodes/<subresource>`` named after the node, with the kubelet's
mapping from path to subresource (``/healthz`` → ``healthz``, then ``proxy``; anything else here → ``proxy``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kanri.runtime import ApiError, Client, Kind

Obj = dict[str, Any]

API_SERVER_USER = "kube-apiserver-kubelet-client"
"""The CN of the API server's kubelet client certificate (written by the control plane's kubeletclient.go)."""

TOKEN_REVIEW = Kind("authentication.k8s.io/v1", "TokenReview", "tokenreviews", namespaced=False)
SUBJECT_ACCESS_REVIEW = Kind("authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False)

_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class User:
    """An authenticated caller, as a ``user.Info``."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)


class AuthError(Exception):
    """The request is refused: ``status`` 401, 403 or 500, the message the kubelet's body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def certificate_user(peercert: Obj | None) -> User | None:
    """The user of a verified client certificate (``ssl.SSLSocket.getpeercert()``'s dict), or None."""
    if not peercert:
        return None
    names: dict[str, list[str]] = {}
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            names.setdefault(key, []).append(value)
    common = names.get("commonName") or []
    if not common:
        return None
    return User(common[0], tuple(names.get("organizationName") or ()))


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def subresources(path: str) -> list[str]:
    """The ``nodes`` subresources a request is checked against, in order (allowed if any is)."""
    if path == "/healthz" or path.startswith("/healthz/"):
        return ["healthz", "proxy"]
    return ["proxy"]


def verb(method: str) -> str:
    return _VERBS.get(method.upper(), "")


class NodeAuthorizer:
    """Authenticates and authorizes requests to one node's kubelet API through the API server."""

    def __init__(self, client: Client, node_name: str) -> None:
        self._client = client
        self.node_name = node_name

    async def authenticate(self, peercert: Obj | None, authorization: str | None) -> User:
        user = certificate_user(peercert)
        if user is not None:
            return user
        token = bearer_token(authorization)
        if token is None:
            raise AuthError(401, "Unauthorized")
        try:
            review = await self._client.create(TOKEN_REVIEW, {"spec": {"token": token}})
        except ApiError as exc:
            raise AuthError(401, "Unauthorized") from exc
        status = review.get("status") or {}
        if not status.get("authenticated"):
            raise AuthError(401, "Unauthorized")
        info = status.get("user") or {}
        return User(
            info.get("username", ""),
            tuple(info.get("groups") or ()),
            info.get("uid", ""),
            {k: list(v) for k, v in (info.get("extra") or {}).items()},
        )

    async def authorize(self, user: User, method: str, path: str) -> None:
        """Return if ``user`` may make the request; raise :class:`AuthError` (403, or 500 when a review fails)."""
        if user.name == API_SERVER_USER:
            return
        action = verb(method)
        checked = subresources(path)
        for subresource in checked:
            attributes = {"verb": action, "resource": "nodes", "subresource": subresource, "name": self.node_name}
            spec: Obj = {"user": user.name, "groups": list(user.groups), "resourceAttributes": attributes}
            if user.uid:
                spec["uid"] = user.uid
            if user.extra:
                spec["extra"] = user.extra
            try:
                review = await self._client.create(SUBJECT_ACCESS_REVIEW, {"spec": spec})
            except ApiError as exc:
                raise AuthError(
                    500,
                    f"Authorization error (user={user.name}, verb={action}, resource=nodes, subresource={subresource})",
                ) from exc
            if (review.get("status") or {}).get("allowed"):
                return
        raise AuthError(
            403, f"Forbidden (user={user.name}, verb={action}, resource=nodes, subresource(s)=[{' '.join(checked)}])\n"
        )
