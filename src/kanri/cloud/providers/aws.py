"""The aws provider: a DatabaseInstance is an RDS DB instance, reached through boto3 at any endpoint.

Blocking SDK calls run in a thread (``asyncio.to_thread``) so no reconcile waits on another's call. The SDK's own
retries are off: the operator decides when to call again (request budget, backoff per state), so one call here is
one request at RDS. Idempotency: the DBInstanceIdentifier is derived from the DatabaseInstance and the database
carries its uid as a tag; a create repeated after a crash finds the database instead of making a second one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

# boto3 ships no type information (mypy-boto3-rds types the client only; pyproject has no override for these).
import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

from kanri.cloud.providers import aws_errors, aws_shapes
from kanri.cloud.providers.base import (
    COMMON_FIELDS,
    Capabilities,
    Connection,
    Desired,
    Observed,
    Operation,
    ProviderError,
    ProviderSetup,
    Retryable,
    UserMustFix,
)

__all__ = ["CAPABILITIES", "AwsProvider", "provider"]

CAPABILITIES = Capabilities(
    # Allowed CIDRs need VPC security groups, which this provider does not manage: set, they are Unsupported.
    fields=frozenset(COMMON_FIELDS) - {"network.allowedCidrs"},
    extension_fields=frozenset({"instanceClass", "storageType", "iops", "parameterGroup"}),
    downtime_fields=frozenset({"size", "version", "providers.aws.instanceClass", "providers.aws.storageType"}),
    immutable_fields=frozenset({"engine", "region"}),
)

_SDK_CONFIG = botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5,
                                     read_timeout=20)  # fmt: skip


class AwsProvider:
    """RDS for one account, endpoint and region. ``credentials`` holds ``accessKeyId``/``secretAccessKey``
    (and ``sessionToken``), or is None for the SDK's default chain; it is never logged or kept in a repr."""

    name = "aws"

    def __init__(self, *, region: str, endpoint_url: str | None, account: str, sizes: Mapping[str, str],
                 credentials: Mapping[str, str] | None, subnet_group: str | None = None) -> None:  # fmt: skip
        self.region, self.endpoint_url, self.account = region, endpoint_url, account
        self.sizes, self.subnet_group = dict(sizes), subnet_group
        keys: dict[str, Any] = {}
        if credentials is not None:
            keys = {"aws_access_key_id": credentials.get("accessKeyId"),
                    "aws_secret_access_key": credentials.get("secretAccessKey"),
                    "aws_session_token": credentials.get("sessionToken")}  # fmt: skip
        session = boto3.session.Session()
        self._rds: Any = session.client(
            "rds", region_name=region, endpoint_url=endpoint_url, config=_SDK_CONFIG, **keys
        )

    def __repr__(self) -> str:
        return f"AwsProvider(region={self.region!r}, endpoint_url={self.endpoint_url!r}, account={self.account!r})"

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def budget_key(self) -> str:
        return f"aws:{self.account}@{self.endpoint_url or 'aws'}/{self.region}"

    def size_for(self, desired: Desired) -> str:
        override = desired.extension.get("instanceClass")
        if override:
            return str(override)
        if desired.size not in self.sizes:
            known = ", ".join(sorted(self.sizes))
            raise UserMustFix(f"size {desired.size!r} is not defined by the class (it defines {known})",
                              field="size", reason="UnknownSize")  # fmt: skip
        return self.sizes[desired.size]

    async def _call(self, action: str, method: Callable[..., dict[str, Any]], **parameters: Any) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(method, **parameters)
        except botocore.exceptions.ClientError as error:
            info = error.response.get("Error", {})
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
            raise aws_errors.classify(str(info.get("Code", "")), str(info.get("Message", "")), status, action) \
                from None  # fmt: skip
        except botocore.exceptions.NoCredentialsError:
            raise UserMustFix(f"{action}: no AWS credentials", reason="NoCredentials", action=action) from None
        except (botocore.exceptions.BotoCoreError, OSError) as error:  # connection refused/reset, timeouts
            raise Retryable(f"{action}: {type(error).__name__}: {error}", action=action) from None

    async def describe(self, external_id: str) -> Observed | None:
        try:
            answer = await self._call("DescribeDBInstances", self._rds.describe_db_instances,
                                      DBInstanceIdentifier=external_id)  # fmt: skip
        except UserMustFix as error:
            if "DBInstanceNotFound" in error.message:
                return None
            raise
        instances = answer.get("DBInstances") or []
        return aws_shapes.observed_from(instances[0]) if instances else None

    async def find(self, desired: Desired) -> Observed | None:
        return await self.describe(desired.identifier)

    async def create(self, desired: Desired, token: str, password: str) -> Operation:
        parameters = aws_shapes.create_parameters(desired, self.size_for(desired), password, self.subnet_group)
        try:
            await self._call("CreateDBInstance", self._rds.create_db_instance, **parameters)
        except UserMustFix as error:
            if error.reason != "NameTaken":
                raise
            # A create already accepted (the operator died before recording it): ours when it carries our uid.
            found = await self.describe(desired.identifier)
            if found is None or found.owner_uid != desired.owner_uid:
                raise UserMustFix(f"an RDS instance named {desired.identifier} exists and was not created for this "
                                  "DatabaseInstance (adopt it with spec.adoptExternalId)", reason="NameTaken",
                                  action="CreateDBInstance") from None  # fmt: skip
        return Operation("Create", token, "available", datetime.now(UTC))

    async def modify(self, external_id: str, desired: Desired, fields: tuple[str, ...], *, immediately: bool) \
            -> Operation:  # fmt: skip
        parameters = aws_shapes.modify_parameters(desired, self.size_for(desired), fields, immediately)
        parameters["DBInstanceIdentifier"] = external_id
        answer = await self._call("ModifyDBInstance", self._rds.modify_db_instance, **parameters)
        request = answer.get("ResponseMetadata", {}).get("RequestId") or f"modify-{external_id}"
        return Operation("Modify", str(request), "available", datetime.now(UTC), fields)

    async def delete(self, external_id: str, final_snapshot_id: str | None) -> Operation:
        parameters: dict[str, Any] = {"DBInstanceIdentifier": external_id, "DeleteAutomatedBackups": False}
        if final_snapshot_id is None:
            parameters["SkipFinalSnapshot"] = True
        else:
            parameters |= {"SkipFinalSnapshot": False, "FinalDBSnapshotIdentifier": final_snapshot_id}
        try:
            await self._call("DeleteDBInstance", self._rds.delete_db_instance, **parameters)
        except ProviderError as error:
            if "DBInstanceNotFound" not in error.message:
                raise  # already gone counts as deleted; anything else is an answer to act on
        return Operation("Delete", final_snapshot_id or f"delete-{external_id}", "deleted", datetime.now(UTC))

    async def snapshot_state(self, snapshot_id: str) -> str | None:
        """The state of a DB snapshot (``available`` once the final snapshot is complete), None when absent."""
        try:
            answer = await self._call("DescribeDBSnapshots", self._rds.describe_db_snapshots,
                                      DBSnapshotIdentifier=snapshot_id)  # fmt: skip
        except UserMustFix as error:
            if "DBSnapshotNotFound" in error.message:
                return None
            raise
        snapshots = answer.get("DBSnapshots") or []
        return str(snapshots[0].get("Status", "unknown")).lower() if snapshots else None

    async def release(self, external_id: str) -> None:
        return None  # RDS holds nothing of ours besides the tag, which stays to say where it came from

    async def connection(self, observed: Observed, password: str | None) -> Connection | None:
        if not observed.host or not observed.port or password is None:
            return None
        return Connection(host=observed.host, port=observed.port, dbname=observed.dbname or aws_shapes.DATABASE_NAME,
                          username=observed.username or aws_shapes.MASTER_USERNAME, password=password)  # fmt: skip


def provider(setup: ProviderSetup) -> AwsProvider:
    """The aws provider a DatabaseClass configures (the registry's entry)."""
    profile = setup.spec.aws
    if profile is None:
        raise UserMustFix(f"DatabaseClass {setup.class_name} has no aws profile", reason="NoProfile")
    return AwsProvider(
        region=profile.region,
        endpoint_url=profile.endpoint_url,
        account=profile.account,
        sizes=profile.sizes,
        credentials=setup.credentials,
        subnet_group=profile.subnet_group,
    )
