"""kanri.contract.instance_config: what the operator writes into ``instance.json`` is what the instance manager
parses, and the model renders the same bytes the operator's writer produces, so the operator can build it from the
model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kanri.contract.instance_config import ArchiveTarget, ClusterConfig, RecoveryPlan, UpgradeNote
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.config import instance_config

SPEC = PostgresClusterSpec.model_validate({
    "version": 16, "storage": {"size": "1Gi"}, "replication": {"mode": "Sync", "syncStandbys": 1},
    "postgresql": {"parameters": {"work_mem": "8MB", "max_connections": "200", "jit": "off"}},
})  # fmt: skip
ARCHIVE = {"destination": "s3://backups/orders", "endpointURL": "http://10.0.0.5:8333", "serverName": "orders.pg16"}
RECOVERY = {"source": {**ARCHIVE, "serverName": "old", "region": "eu-west-1"}, "backup": "20261206T060001",
            "targetTime": datetime(2026, 12, 6, 6, 30, tzinfo=UTC).isoformat()}  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "new cluster": {},
    "initialised": {"system_identifier": "7329117425863524378"},
    "archiving": {"system_identifier": "7329117425863524378", "archive": ARCHIVE},
    "restoring": {"archive": ARCHIVE, "recovery": RECOVERY},
    "restoring to an LSN": {"recovery": {"source": ARCHIVE, "targetLSN": "0/5000A0"}},
    "restoring to the backup's end": {"recovery": {"source": ARCHIVE, "targetImmediate": True}},
    "after a major upgrade": {"system_identifier": "7329117425863524378", "upgrade": {"to": 17, "primary": "orders-2"}},
}


@pytest.mark.parametrize("extra", CASES.values(), ids=CASES.keys())
def test_the_operators_instance_json_parses_and_renders_to_the_same_bytes(extra: dict[str, Any]) -> None:
    written = instance_config(SPEC, ["orders-1", "orders-2"], **extra)
    config = ClusterConfig.parse(written.encode())
    assert config.instances == ("orders-1", "orders-2")
    assert config.synchronous_standbys == 1
    assert config.parameters == {"work_mem": "8MB", "max_connections": "200", "jit": "off"}
    assert config.render() == written


def test_the_entries_read_as_their_models() -> None:
    written = instance_config(SPEC, ["orders-1"], "7329117425863524378", ARCHIVE, RECOVERY,
                              {"to": 17, "primary": "orders-1"})  # fmt: skip
    config = ClusterConfig.parse(written.encode())
    assert config.archive == ArchiveTarget.model_validate(ARCHIVE)
    assert config.recovery is not None
    assert config.recovery == RecoveryPlan.model_validate(RECOVERY)
    assert config.recovery.target_time == datetime(2026, 12, 6, 6, 30, tzinfo=UTC)
    assert config.recovery.source.region == "eu-west-1"
    assert config.upgrade == UpgradeNote(to=17, primary="orders-1")


def test_a_bad_file_is_refused_with_a_short_reason() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        ClusterConfig.parse(b"{")
    with pytest.raises(ValueError, match="invalid"):
        ClusterConfig.parse(b'{"systemIdentifier": "abc"}')
    with pytest.raises(ValueError, match="invalid"):
        ClusterConfig.parse(b'{"recovery": {"source": {}, "targetLSN": "0/1", "targetImmediate": true}}')
