"""The local object store as a workload: the manifests are restricted-PSA compatible and keep the keys out of argv;
the pod's entry point writes the identity file privately and binds weed to the pod's IP."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

from kanri.local import s3server
from kanri.local.imagemap import default_image_map
from kanri.local.seaweedfs import S3_PORT, SEAWEEDFS_IMAGE, S3Keys, keys_secret, object_store


def test_statefulset_is_restricted_and_mounts_the_keys_read_only() -> None:
    service, sts = object_store("kanri-system")
    assert service["spec"]["ports"][0]["port"] == S3_PORT
    pod = sts["spec"]["template"]["spec"]
    assert sts["spec"]["replicas"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == SEAWEEDFS_IMAGE
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "keys", "mountPath": "/etc/kanri/s3", "readOnly": True} in container["volumeMounts"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "s3"}
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_keys_live_only_in_the_secret() -> None:
    keys = S3Keys("AKID", "very-secret-value")
    secret = keys_secret("kanri-system", keys)
    assert base64.b64decode(secret["data"]["secretAccessKey"]).decode() == "very-secret-value"
    assert "very-secret-value" not in json.dumps(object_store("kanri-system"))


def test_entry_point_writes_a_private_identity_file_and_binds_the_pod_ip(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "accessKeyId").write_text("AKID\n")
    (keys / "secretAccessKey").write_text("very-secret-value\n")
    identity = tmp_path / "s3.json"
    identity.write_text("stale")
    s3server.write_identity(keys, identity)
    assert stat.S_IMODE(identity.stat().st_mode) == 0o600
    config = json.loads(identity.read_text())
    assert config["identities"][0]["credentials"] == [{"accessKey": "AKID", "secretKey": "very-secret-value"}]
    argv = s3server.argv("/bin/weed", tmp_path / "data", identity, 8333, "kanri-s3-0", "10.244.0.7", "kanri-backups")
    assert "-ip=kanri-s3-0" in argv  # a stable name: a re-created pod has a new IP
    assert "-ip.bind=10.244.0.7" in argv
    assert "-bucket=kanri-backups" in argv
    assert not any("very-secret-value" in part for part in argv)


def test_image_map_has_the_object_store_when_weed_is_installed() -> None:
    entries = {e["image"]: e for e in default_image_map()}
    if SEAWEEDFS_IMAGE in entries:
        assert entries[SEAWEEDFS_IMAGE]["command"][-1] == "kanri.local.s3server"
        assert Path(entries[SEAWEEDFS_IMAGE]["env"]["KANRI_WEED"]).name == "weed"
