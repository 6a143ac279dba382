"""Which PostgreSQL images the operator runs, per major: the platform's configuration, never a name only one cluster
understands.

The Helm chart sets ``KANRI_POSTGRES_IMAGES`` on the operator's pod to a JSON object (docs/install.md)::

    {"postgres": {"17": "registry.example.com/kanri/kanri-postgres:17@sha256:…", …},
     "upgrade": {"18": "registry.example.com/kanri/kanri-postgres-upgrade:18@sha256:…", …}}

that is, the instance image of each major and the major-upgrade image of each target major. A major the configuration
does not name falls back to ``kanri.dev/postgres:<major>`` (``kanri.dev/postgres-upgrade:<to>``), the
names the local cluster's node maps to programs of the checkout.

Every reference keeps the major as its tag (``…:17@sha256:…``): the operator reads a running StatefulSet's major from
it (:func:`tag_major`), and the digest, when there is one, is what Kubernetes pulls.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["DEFAULT_IMAGES", "ENV", "INSTANCE_IMAGE", "UPGRADE_IMAGE", "PostgresImages", "tag_major"]

INSTANCE_IMAGE = "kanri.dev/postgres"
UPGRADE_IMAGE = "kanri.dev/postgres-upgrade"
ENV = "KANRI_POSTGRES_IMAGES"


def tag_major(image: str) -> int | None:
    """The PostgreSQL major of an image reference from its tag, ``<major>`` or ``<major>.<minor>`` (``17.11``);
    a digest after the tag (``:17@sha256:…``) is ignored."""
    name = image.split("@", 1)[0]
    repository, _, tag = name.rpartition(":")
    if "/" in tag or not repository:
        return None  # no tag: the colon was a registry's port
    head = tag.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _majors(kind: str, refs: object) -> Mapping[int, str]:
    if not isinstance(refs, dict):
        raise ValueError(f"{ENV}: {kind} must map majors to image references")
    checked: dict[int, str] = {}
    for key, ref in refs.items():
        if not str(key).isdigit() or not isinstance(ref, str) or not ref:
            raise ValueError(f"{ENV}: {kind}.{key} must be a major and an image reference")
        if tag_major(ref) != int(key):
            raise ValueError(f"{ENV}: {kind}.{key} is {ref!r}, whose tag is not major {key} (use …:{key}@sha256:…)")
        checked[int(key)] = ref
    return MappingProxyType(checked)


@dataclass(frozen=True)
class PostgresImages:
    """Image references by major: ``instance`` for the instances (and restore rehearsals), ``upgrade`` for the
    major upgrade's pods (keyed by the major upgraded to)."""

    instance: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    upgrade: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))

    def for_major(self, major: int) -> str:
        """The instance image of ``major``."""
        return self.instance.get(major) or f"{INSTANCE_IMAGE}:{major}"

    def for_upgrade(self, to: int) -> str:
        """The image of an upgrade to ``to`` (it holds the older majors' programs too, for pg_upgrade)."""
        return self.upgrade.get(to) or f"{UPGRADE_IMAGE}:{to}"

    @classmethod
    def parse(cls, text: str) -> PostgresImages:
        """From the JSON of the module docstring; raises ValueError naming what is wrong."""
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV} is not JSON: {exc}") from None
        if not isinstance(loaded, dict) or set(loaded) - {"postgres", "upgrade"}:
            raise ValueError(f'{ENV} must be an object with "postgres" and "upgrade"')
        return cls(_majors("postgres", loaded.get("postgres", {})), _majors("upgrade", loaded.get("upgrade", {})))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> PostgresImages:
        """From ``KANRI_POSTGRES_IMAGES`` (the chart sets it); unset or empty: the defaults."""
        text = (os.environ if environ is None else environ).get(ENV, "").strip()
        return cls.parse(text) if text else cls()


DEFAULT_IMAGES = PostgresImages()
