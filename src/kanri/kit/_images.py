"""The images an operator runs for its workloads, by version, from a JSON table in the operator's environment.

The Helm chart writes the table from the registry, repository and digests it was given (``{"9.1":
"registry.example/kanri-valkey:9.1@sha256:..."}``), so a real cluster pulls each workload image from a registry of
its own, pinned by digest. Without the variable, or for a version it does not list, the image is the local
cluster's name ``<local>:<version>`` (which the local node maps to what ``make images`` built).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping

__all__ = ["image_for", "image_table"]


def image_table(env: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The table in the environment variable ``env`` (unset or empty: none). A malformed table is refused naming
    the variable: an operator must not quietly fall back to images nobody pinned."""
    return dict(_parse(env, (os.environ if environ is None else environ).get(env, "")))


def image_for(env: str, local: str, version: str, environ: Mapping[str, str] | None = None) -> str:
    """The image of ``version``: the table's entry in ``env``, else ``<local>:<version>``."""
    return image_table(env, environ).get(version) or f"{local}:{version}"


@functools.lru_cache(maxsize=8)
def _parse(env: str, text: str) -> tuple[tuple[str, str], ...]:
    if not text.strip():
        return ()
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{env} is not JSON: {exc}") from None
    well_formed = isinstance(table, dict) and all(isinstance(v, str) and v for v in table.values())
    if not well_formed:
        raise ValueError(f"{env} must be a JSON object of version -> image reference, got {text[:200]!r}")
    return tuple(sorted(table.items()))
