"""Backups: when, how long to keep them, where they go, and the regular restore rehearsal."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.postgres.api.v1alpha1.storage import DNS_SUBDOMAIN, Volume
from kanri.runtime import cel

__all__ = ["CRON_PATTERN", "Backup", "Cron", "Repository", "RestoreTest", "S3Credentials", "S3Repository"]


def _cron_pattern() -> str:
    """Standard 5-field cron (as CronJobs take it) or a macro such as @daily; written without backslashes so the
    same text works in Python, in Go's RE2 and inside a CEL string literal."""

    def field(value: str, *, question: bool = False) -> str:
        wildcard = "[*?]" if question else "[*]"
        item = f"({wildcard}|{value}(-{value})?)([/][1-9][0-9]*)?"
        return f"{item}(,{item})*"

    minute = "[0-5]?[0-9]"
    hour = "([01]?[0-9]|2[0-3])"
    day = "(0?[1-9]|[12][0-9]|3[01])"
    month = "(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))"
    weekday = "([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat))"
    fields = "[ ]+".join(
        [field(minute), field(hour), field(day, question=True), field(month), field(weekday, question=True)]
    )
    return f"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|{fields})$"


CRON_PATTERN = _cron_pattern()
_CRON = re.compile(CRON_PATTERN)


def _check_cron(value: str) -> str:
    if not _CRON.fullmatch(value):
        raise ValueError(f"not a 5-field cron expression: {value!r}")
    return value


Cron = Annotated[
    str,
    Field(max_length=128),
    AfterValidator(_check_cron),
    # CEL rather than `pattern`: the API server would quote the whole regular expression back at the user.
    cel(
        f"self.matches('{CRON_PATTERN}')",
        message_expression='\'not a cron schedule: "%s"; use 5 fields (minute hour day-of-month month day-of-week, '
        'in UTC) such as "0 3 * * *", or a macro such as @daily\'.format([self])',
    ),
]
"""A cron schedule in UTC: five fields (``0 3 * * *``) or a macro (``@hourly``, ``@daily``, ``@weekly``, ...)."""


class S3Credentials(ApiModel):
    """The Secret (in the cluster's namespace) holding the S3 access key pair. Required. Its values never appear in
    status, Events or logs."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
    """Name of the Secret. Required."""

    access_key_id_key: Annotated[str, Field(min_length=1, max_length=253)] = "accessKeyId"
    """Key of the access key ID in the Secret. Default accessKeyId."""

    secret_access_key_key: Annotated[str, Field(min_length=1, max_length=253)] = "secretAccessKey"
    """Key of the secret access key in the Secret. Default secretAccessKey."""


class S3Repository(ApiModel):
    """An S3-compatible object store (AWS S3, MinIO, SeaweedFS, Ceph RGW, ...). Base backups and archived WAL go
    under <path>/<cluster name>/ in the bucket."""

    endpoint: Annotated[
        str,
        Field(max_length=2048),
        cel(
            "isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",
            message_expression="'endpoint must be an http(s) URL such as https://s3.eu-west-1.amazonaws.com, not "
            '"%s"\'.format([self])',
        ),
    ]
    """URL of the object store, e.g. https://s3.eu-west-1.amazonaws.com or http://127.0.0.1:8333. Required."""

    bucket: Annotated[str, Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")]
    """Name of the bucket; it must exist. Required."""

    path: Annotated[str, Field(max_length=1024, pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$")] | None = (
        None
    )
    """Key prefix inside the bucket, without leading or trailing slash (e.g. prod/eu). Default: none."""

    region: Annotated[str, Field(max_length=64, pattern=r"^[a-z0-9-]+$")] | None = None
    """Region of the bucket, e.g. eu-west-1. Default: none (what the endpoint implies)."""

    credentials_secret: S3Credentials


class Repository(
    ApiModel,
    validations=[
        cel(
            "has(self.volume) != has(self.s3)",
            "backup.repository needs exactly one of volume or s3",
        ),
        # Refused, not accepted and ignored: a volume repository is not served by this release (issue 29 item 5).
        cel(
            "!has(self.volume)",
            "repository.volume is not supported by this release: use s3 (an object store, which also survives the "
            "loss of this Kubernetes cluster)",
        ),
    ],
):
    """Where base backups and archived WAL are kept: s3 (volume is refused by the API in this release).
    Changing it starts a fresh base backup in the new repository; the old repository is left untouched."""

    volume: Volume | None = None
    """Not supported by this release: the API refuses it. (A persistent volume claimed for the repository would live
    in the same Kubernetes cluster as the data, so it would not protect against losing that cluster.)"""

    s3: S3Repository | None = None
    """An S3-compatible object store."""


class RestoreTest(ApiModel):
    """A regular restore rehearsal: the latest backup is restored into a throwaway instance that must start and
    reach a consistent state; the result is recorded in status.backup.lastRestoreTest. On by default (weekly),
    because a backup nobody ever restored is a hope, not a backup."""

    enabled: bool = True
    """Whether rehearsals run. Default true."""

    schedule: Cron = "0 5 * * 0"
    """When rehearsals run (cron, UTC). Default weekly, Sunday 05:00."""


class Backup(ApiModel):
    """Continuous backups: scheduled base backups plus continuous WAL archiving, which together allow point-in-time
    recovery to any moment since the oldest backup kept. Without this section the cluster has no backups."""

    schedule: Cron = "0 3 * * *"
    """When base backups are taken (cron, UTC). Default daily at 03:00. WAL is archived continuously in between."""

    retention_days: Annotated[int, Field(ge=1, le=3650)] = 7
    """How many days of backups to keep (1 to 3650). Default 7. Older base backups and the WAL only they need are
    deleted, but the newest successful base backup is always kept. Lowering it deletes the expired backups at the
    next cleanup."""

    repository: Repository | None = None
    """Where this cluster's backups go. Default: the platform's default repository (the operator's
    ``--default-backup-repository``, see docs/backups.md), so the same manifest works in every environment. Set, it
    wins over the default. With neither, the cluster runs without archiving and says so (condition
    ContinuousArchiving=False, reason NoRepository)."""

    restore_test: RestoreTest = RestoreTest()
