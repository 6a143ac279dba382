"""The local control plane's admission configuration (issue 33: Pod Security by default).

What the API server does with it is proven by tests/integration/test_tenant_pod_security.py; here, its shape: one
PodSecurity plugin entry in the v1 schemas the API server reads, the levels the issue asks for, nothing exempt.
"""

from __future__ import annotations

import json
from pathlib import Path

from kanri.local.controlplane import ControlPlane, admission_configuration


def test_namespaces_without_a_level_get_baseline_enforced_and_restricted_warned_and_audited() -> None:
    config = admission_configuration()
    assert (config["apiVersion"], config["kind"]) == ("apiserver.config.k8s.io/v1", "AdmissionConfiguration")
    (plugin,) = config["plugins"]
    assert plugin["name"] == "PodSecurity"
    pod_security = plugin["configuration"]
    assert (pod_security["apiVersion"], pod_security["kind"]) == (
        "pod-security.admission.config.k8s.io/v1",
        "PodSecurityConfiguration",
    )
    assert pod_security["defaults"] == {
        "enforce": "baseline",
        "enforce-version": "latest",
        "warn": "restricted",
        "warn-version": "latest",
        "audit": "restricted",
        "audit-version": "latest",
    }


def test_nothing_is_exempt() -> None:
    exemptions = admission_configuration()["plugins"][0]["configuration"]["exemptions"]
    assert exemptions == {"usernames": [], "runtimeClasses": [], "namespaces": []}


def test_the_file_is_rewritten_whole_on_each_start(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "cp")
    cp.data_dir.mkdir()
    cp.admission_config.write_text("stale: from an older kanri\n")
    assert cp.write_admission_config() == cp.data_dir / "admission.json"
    assert json.loads(cp.admission_config.read_text()) == admission_configuration()
    assert sorted(p.name for p in cp.data_dir.iterdir()) == ["admission.json"]  # no temporary file left
