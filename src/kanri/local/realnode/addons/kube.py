"""kubectl for the add-ons: server-side apply of a list of objects as the control plane's admin."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


class AddonError(RuntimeError):
    """An add-on could not be applied or started; the message says what kubectl or the process reported."""


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """Run kubectl as the admin of ``kubeconfig``; its stdout."""
    result = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise AddonError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def apply(kubeconfig: Path, objects: list[dict[str, Any]]) -> None:
    """Server-side apply of ``objects`` (idempotent: applying the same objects again changes nothing)."""
    items = {"apiVersion": "v1", "kind": "List", "items": objects}
    kubectl(kubeconfig, "apply", "--server-side", "--field-manager=kanri-addons", "-f", "-", stdin=json.dumps(items))
