"""Each namespace's own identity in the platform's default backup repository: the tenant boundary.

The default repository is shared by every namespace, each in a folder of its own (``<bucket>/<path>/<namespace>/``).
The platform's key pair (the repository's ``credentialsSecret``, in the operator's namespace) opens the whole bucket,
so it never leaves the operator: pods get a key pair of their namespace's own identity instead, which the object
store's access control confines to that namespace's folder — listing, reading, writing and deleting anywhere else
is refused by the store itself, whatever a tenant does with the keys.

- The identity is an IAM user ``kanri-<namespace>-<hash>`` (the hash of bucket and folder: two installations sharing
  a store never share a user) with one inline policy, ``kanri-backups`` (:func:`policy`): ``s3:ListBucket`` on the
  bucket only for prefixes under the folder, ``s3:GetObject``/``PutObject``/``DeleteObject`` on objects under it.
  Made through the store's IAM API (:mod:`kanri.postgres.backup.iam`: AWS IAM, SeaweedFS's embedded IAM; see
  docs/backups.md for MinIO and others).
- Its key pair is kept in the Secret ``kanri-backup-tenant-<namespace>`` in the operator's namespace (tenants cannot
  touch it) and copied by the operator into each cluster's ``<cluster>-backup-credentials`` /
  ``<cluster>-recovery-credentials``.
- :meth:`TenantIdentities.keys` is idempotent: the user and policy are (re)applied, the kept key is checked against
  the user's keys, and only a missing or foreign one is replaced (the user's other keys are deleted then: nobody holds
  them, and AWS allows two per user). A verified namespace is not asked again for :data:`RECHECK` seconds, so a
  converged cluster costs no IAM call; calls for one namespace are serialised (two clusters of a namespace reconciled
  at once make one key, not two).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from kanri.postgres.backup.iam import IamClient, IamError
from kanri.postgres.backup.s3 import S3Keys
from kanri.postgres.cluster.sync import FIELD_MANAGER
from kanri.postgres.credentials.secrets import secret_value
from kanri.runtime import ApiError, Client, Kind
from kanri.runtime.kinds import SECRET

__all__ = [
    "POLICY_NAME",
    "RECHECK",
    "TenantIdentities",
    "folder",
    "inside",
    "keys_secret_name",
    "policy",
    "user_name",
]

log = structlog.get_logger("kanri.postgres.backup.tenant_identity")
Obj = dict[str, Any]
POLICY_NAME = "kanri-backups"
RECHECK = 600.0
"""Seconds a verified namespace identity is trusted without asking the store again."""
ACCESS_KEY_ID = "accessKeyId"
SECRET_ACCESS_KEY = "secretAccessKey"
_MAX_USER = 64
"""IAM user names are at most 64 characters."""


class Cached(Protocol):
    """What is read from the informer cache (:class:`kanri.runtime.Cache` is one)."""

    def get(self, kind: Kind, name: str, namespace: str = "") -> Obj | None: ...


def folder(path: str | None, namespace: str) -> str:
    """The namespace's folder in the default repository's bucket, without slashes at either end."""
    return "/".join(p for p in ((path or "").strip("/"), namespace) if p)


def inside(own_folder: str, path: str | None) -> bool:
    """Whether a repository ``path`` (a key prefix in the same bucket) lies within ``own_folder``."""
    wanted = (path or "").strip("/")
    return wanted == own_folder or wanted.startswith(own_folder + "/")


def user_name(bucket: str, path: str | None, namespace: str) -> str:
    """The namespace's IAM user: readable, unique per (bucket, folder), within IAM's 64 characters."""
    digest = hashlib.sha256(f"{bucket}/{folder(path, namespace)}".encode()).hexdigest()[:8]
    room = _MAX_USER - len("kanri--") - len(digest)
    return f"kanri-{namespace[:room]}-{digest}"


def keys_secret_name(namespace: str) -> str:
    """The Secret in the operator's namespace that keeps the namespace identity's key pair."""
    return f"kanri-backup-tenant-{namespace}"[:253]


def policy(bucket: str, path: str | None, namespace: str) -> str:
    """The identity's inline policy: its folder and nothing else (no bucket listing outside it, no IAM)."""
    own = folder(path, namespace)
    document = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [f"{own}/*"]}}},
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
             "Resource": [f"arn:aws:s3:::{bucket}/{own}/*"]},
        ],
    }  # fmt: skip
    return json.dumps(document, sort_keys=True)


@dataclass
class TenantIdentities:
    """Makes and keeps the namespace identities of one default repository (one per operator)."""

    endpoint: str
    """The IAM endpoint (the S3 endpoint for SeaweedFS; ``https://iam.amazonaws.com`` for AWS)."""
    bucket: str
    path: str | None
    operator_namespace: str
    region: str = "us-east-1"
    clock: Callable[[], float] = time.monotonic
    _verified: dict[str, tuple[str, float]] = field(default_factory=dict)
    _failed: dict[str, tuple[IamError, float, int]] = field(default_factory=dict)
    """The last failure per namespace, when, and how many in a row: the store is not asked again before the backoff
    (2 s doubling to 5 min) has passed, so an unanswering IAM API never holds a reconcile worker pass after pass."""
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def forget(self, namespace: str) -> None:
        """Drop what is remembered of ``namespace`` (its next use checks with the store again)."""
        self._verified.pop(namespace, None)
        self._failed.pop(namespace, None)
        self._locks.pop(namespace, None)

    async def keys(self, client: Client, cache: Cached, platform: S3Keys, namespace: str) -> S3Keys:
        """The namespace identity's key pair, made or repaired when needed; IamError or ApiError when that fails."""
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            name = keys_secret_name(namespace)
            kept = cache.get(SECRET, name, self.operator_namespace)
            if kept is None:
                try:
                    kept = await client.get(SECRET, name, self.operator_namespace)
                except ApiError as exc:
                    if not exc.not_found:
                        raise
                    kept = None
            key_id, secret = secret_value(kept, ACCESS_KEY_ID), secret_value(kept, SECRET_ACCESS_KEY)
            remembered = self._verified.get(namespace)
            if key_id and secret and remembered and remembered[0] == key_id and \
                    self.clock() - remembered[1] < RECHECK:  # fmt: skip
                return S3Keys(key_id, secret)
            failed = self._failed.get(namespace)
            if failed is not None and self.clock() - failed[1] < min(300.0, 2.0 * 2 ** (failed[2] - 1)):
                raise failed[0]
            try:
                key_id, secret = await self._ensure(client, platform, namespace, key_id, secret)
            except IamError as exc:
                count = failed[2] + 1 if failed is not None else 1
                self._failed[namespace] = (exc, self.clock(), count)
                log.warning("cannot make the namespace's backup identity", namespace=namespace, error=str(exc),
                            failures=count)  # fmt: skip
                raise
            self._failed.pop(namespace, None)
            self._verified[namespace] = (key_id, self.clock())
            return S3Keys(key_id, secret)

    async def _ensure(self, client: Client, platform: S3Keys, namespace: str, key_id: str | None,
                      secret: str | None) -> tuple[str, str]:  # fmt: skip
        """The user, its policy and a key pair the user has (the kept one, or a new one kept now)."""
        name = keys_secret_name(namespace)
        user = user_name(self.bucket, self.path, namespace)
        async with IamClient(self.endpoint, platform, self.region) as iam:
            if await iam.create_user(user):
                log.info("made the namespace's backup identity", namespace=namespace, user=user)
            await iam.put_user_policy(user, POLICY_NAME, policy(self.bucket, self.path, namespace))
            existing = await iam.list_access_keys(user)
            if not (key_id and secret and key_id in existing):
                for stale in existing:  # nobody holds these any more (the kept Secret is gone or foreign)
                    await iam.delete_access_key(user, stale)
                made = await iam.create_access_key(user)
                key_id, secret = made.access_key_id, made.secret_access_key
                await self._keep(client, name, key_id, secret, user)
                # no key id in the log: every value of a Secret stays out of logs, the id included
                log.info("new access key for the namespace's backup identity", namespace=namespace, user=user)
        return key_id, secret

    async def _keep(self, client: Client, name: str, key_id: str, secret: str, user: str) -> None:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": self.operator_namespace,
                         "labels": {"app.kubernetes.io/managed-by": "kanri", "kanri.dev/backup-identity": "tenant"},
                         "annotations": {"kanri.dev/iam-user": user}},
            "type": "Opaque",
            "data": {ACCESS_KEY_ID: base64.b64encode(key_id.encode()).decode(),
                     SECRET_ACCESS_KEY: base64.b64encode(secret.encode()).decode()},
        }  # fmt: skip
        await client.apply(SECRET, body, field_manager=FIELD_MANAGER)
