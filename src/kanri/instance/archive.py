"""Continuous WAL archiving: PostgreSQL's ``archive_command`` runs ``kanri-instance archive-wal %p``, which ships one
segment with Barman Cloud's ``barman-cloud-wal-archive``.

Where WAL goes arrives in ``instance.json`` (:class:`kanri.contract.instance_config.ArchiveTarget`: destination URL,
endpoint, server name — no secret); the S3 key pair is read from the files of the mounted repository Secret
(``KANRI_BACKUP_CREDENTIALS_DIR``) and handed to barman in its environment, never on its command line and never
logged. Only a primary archives: ``archive_mode = on`` makes a standby keep its WAL to itself. Building the command
line is pure (here); :func:`kanri.instance.archive_wal.archive_wal` runs it and returns barman's exit code, which
PostgreSQL reads as success (0) or "retry this segment later".
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from kanri.contract.backup import ACCESS_KEY_FILE, SECRET_KEY_FILE
from kanri.contract.instance_config import ArchiveTarget

__all__ = [
    "ACCESS_KEY_FILE",
    "SECRET_KEY_FILE",
    "ArchiveTarget",
    "archive_command",
    "archive_parameters",
    "barman_program",
    "credentials_env",
    "wal_archive_argv",
]


DEFAULT_CREDENTIALS_DIR = Path("/etc/kanri/backup")


def barman_program(program: str, env: Mapping[str, str] | None = None) -> str:
    """Where a Barman Cloud program is: ``$KANRI_BARMAN_BIN/<program>`` when set, else found on ``PATH``."""
    env = os.environ if env is None else env
    directory = env.get("KANRI_BARMAN_BIN", "").strip()
    return str(Path(directory) / program) if directory else program


def cloud_options(target: ArchiveTarget) -> list[str]:
    """The options every Barman Cloud program takes for this repository (path-style addressing: SeaweedFS, MinIO
    and most S3 servers other than AWS's do not serve bucket-named hosts)."""
    return ["--cloud-provider", "aws-s3", "--endpoint-url", target.endpoint, "--addressing-style", "path"]


def wal_archive_argv(target: ArchiveTarget, wal_path: str, env: Mapping[str, str] | None = None) -> list[str]:
    """``barman-cloud-wal-archive`` for one segment, gzip-compressed (built into Python: no extra library)."""
    return [
        barman_program("barman-cloud-wal-archive", env),
        *cloud_options(target),
        "--gzip",
        target.destination,
        target.server_name,
        wal_path,
    ]


def credentials_env(directory: Path, region: str | None = None) -> dict[str, str]:
    """The key pair (from the Secret's files) as the AWS SDK's environment variables; OSError when missing."""
    env = {
        "AWS_ACCESS_KEY_ID": (directory / ACCESS_KEY_FILE).read_text().strip(),
        "AWS_SECRET_ACCESS_KEY": (directory / SECRET_KEY_FILE).read_text().strip(),
    }
    if region:
        env["AWS_DEFAULT_REGION"] = region
    return env


def archive_command(python: str = sys.executable) -> str:
    """The ``archive_command`` PostgreSQL runs for each finished segment (its environment is the manager's, so
    ``PYTHONPATH`` and the ``KANRI_*`` variables reach the wrapper)."""
    return f"{shlex.quote(python)} -m kanri.instance archive-wal %p"


def archive_parameters(target: ArchiveTarget | None, python: str = sys.executable) -> dict[str, str]:
    """The managed archiving keys: archive_mode on with kanri's command when there is a target, else off.
    (archive_mode needs a restart to change; the manager's pending-restart handling takes care of it.)"""
    if target is None:
        return {"archive_mode": "off"}
    return {"archive_mode": "on", "archive_command": archive_command(python)}
