"""Where images go and how kanri talks to a registry: a :class:`Destination` (``REGISTRY/PREFIX`` plus how to trust
it) and :class:`Oras`, the registry client (oras, built from its Go module by ``make registry-tools``).

oras rather than crane or skopeo: it copies an image *with its referrers* (``oras cp -r``: the SBOM and signature
manifests whose ``subject`` is the image) from an OCI layout, byte for byte, so every digest survives; and where a
registry has no referrers API (distribution, Docker Hub) it keeps the referrers tag schema (a ``sha256-<digest>``
index tag) up to date, which cosign and other clients read back. Credentials come from the usual Docker config
(``~/.docker/config.json``, ``oras login``) — kanri never takes a password on a command line.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kanri.local import paths


class RegistryClientError(RuntimeError):
    """oras failed; the message carries what it said."""


@dataclass(frozen=True)
class Destination:
    """``registry`` (``host[:port]``) and a ``prefix`` (repository path under it, may be empty): an image of
    repository ``kanri-operator`` goes to ``registry/prefix/kanri-operator``.

    ``plain_http``: talk HTTP, not HTTPS (a loopback test registry). ``ca_file``: a private CA to trust.
    """

    registry: str
    prefix: str = ""
    plain_http: bool = False
    ca_file: Path | None = None

    @classmethod
    def parse(cls, text: str, *, plain_http: bool = False, ca_file: Path | None = None) -> Destination:
        """``REGISTRY[/PREFIX]`` as a user writes it (``registry.example.com/platform/kanri``)."""
        text = text.strip().rstrip("/")
        for scheme in ("https://", "http://"):
            if text.startswith(scheme):
                raise ValueError(f"{text!r}: name the registry without a scheme (use --plain-http for HTTP)")
        registry, _, prefix = text.partition("/")
        if "@" in text or ":" in prefix or " " in text:
            raise ValueError(f"{text!r}: a destination is REGISTRY[/PREFIX], with no tag or digest")
        # as Docker reads references: a first part without '.' or ':' (and not localhost) is a path, not a host
        if not ("." in registry or ":" in registry or registry == "localhost"):
            raise ValueError(f"{text!r}: begin with the registry's host (registry.example.com/PREFIX)")
        return cls(registry=registry, prefix=prefix, plain_http=plain_http, ca_file=ca_file)

    def repository(self, name: str) -> str:
        """The full repository of image repository ``name`` here."""
        return "/".join(p for p in (self.registry, self.prefix, name) if p)

    def __str__(self) -> str:
        return "/".join(p for p in (self.registry, self.prefix) if p)


def oras_binary() -> Path:
    """oras as ``make registry-tools`` builds it."""
    return paths.build_dir() / "bin" / "oras"


@dataclass(frozen=True)
class Referrer:
    """A manifest attached to an image: its digest and artifact type (an SBOM's, a signature's)."""

    digest: str
    artifact_type: str
    annotations: dict[str, str] = field(default_factory=dict)


class Oras:
    """The oras commands kanri needs, each one process; errors raise :class:`RegistryClientError`."""

    def __init__(self, binary: Path | None = None, registry_config: Path | None = None) -> None:
        self.binary = binary or oras_binary()
        if not self.binary.is_file():
            raise RegistryClientError(f"{self.binary} is missing: run `make registry-tools`")
        self.registry_config = registry_config

    def _run(self, args: list[str]) -> str:
        argv = [str(self.binary), *args]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip()
            raise RegistryClientError(
                f"oras {args[0]} {' '.join(a for a in args[1:] if not a.startswith('-'))}: {said}"
            )
        return result.stdout

    def _trust(self, dest: Destination, prefix: str = "") -> list[str]:
        args = []
        if dest.plain_http:
            args.append(f"--{prefix}plain-http")
        if dest.ca_file is not None:
            args += [f"--{prefix}ca-file", str(dest.ca_file)]
        if self.registry_config is not None:
            args += [f"--{prefix}registry-config", str(self.registry_config)]
        return args

    def copy_from_layout(self, layout: Path, source: str, dest: Destination, target: str) -> None:
        """Copy ``layout``'s ``source`` (a tag, or ``@sha256:…``) and every referrer of it to ``target`` (a full
        reference under ``dest``), keeping every digest."""
        separator = "" if source.startswith("@") else ":"
        self._run(
            [
                "cp",
                "-r",
                "--no-tty",
                "--from-oci-layout",
                f"{layout}{separator}{source}",
                target,
                *self._trust(dest, "to-"),
            ]
        )

    def resolve(self, reference: str, dest: Destination) -> str:
        """The digest ``reference`` (``repo:tag`` or ``repo@digest`` under ``dest``) has in the registry."""
        return self._run(["resolve", reference, *self._trust(dest)]).strip()

    def referrers(self, reference: str, dest: Destination) -> list[Referrer]:
        """The manifests attached to ``reference`` in the registry (the referrers API, else the tag schema)."""
        out: dict[str, Any] = json.loads(self._run(["discover", "--format", "json", reference, *self._trust(dest)]))
        return [
            Referrer(r["digest"], r.get("artifactType", ""), dict(r.get("annotations") or {}))
            for r in out.get("referrers") or out.get("manifests") or []
        ]
