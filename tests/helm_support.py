"""The real ``helm`` (built by ``make helm`` into .build/bin) and the chart in deploy/helm/kanri, for the tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "kanri"
HELM = ROOT / ".build" / "bin" / "helm"

Obj = dict[str, Any]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; a missing binary fails the test (it is part of `make setup`, so CI always has it)."""
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make helm` (part of `make setup`)")
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def template_text(*values: str, release: str = "kanri", namespace: str = "kanri-system") -> str:
    """``helm template`` of the chart with ``--set`` values, as text."""
    sets = [arg for value in values for arg in ("--set", value)]
    return helm("template", release, str(CHART), "--namespace", namespace, *sets).stdout


def template(*values: str, release: str = "kanri", namespace: str = "kanri-system") -> list[Obj]:
    """``helm template`` of the chart with ``--set`` values, as objects."""
    return [d for d in yaml.safe_load_all(template_text(*values, release=release, namespace=namespace)) if d]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]
