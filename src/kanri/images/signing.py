"""Signatures of the images and the Helm chart: sigstore cosign with a key pair the platform holds.

The key pair is made once (``cosign generate-key-pair``) in ``~/.config/kanri/signing/`` (``KANRI_SIGNING_DIR``
overrides), its password a random string in a file of mode 0600 beside it, handed to cosign through the environment
(``COSIGN_PASSWORD``), never on a command line. The public key is copied next to the images.

An image is signed in its OCI layout the way ``cosign save`` stores a signed image: the payload (cosign's "simple
signing" JSON naming the manifest digest) is signed by ``cosign sign-blob``, and a signature manifest holding it is
added to the layout's index with ``kind: dev.cosignproject.cosign/sigs``; the image's entry has ``kind:
dev.cosignproject.cosign/image``. So ``cosign verify --key signing.pub --local-image <layout>`` checks it offline and
``cosign load`` pushes the image with its signature. No transparency log: the key is the platform's own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kanri.images.oci import CONFIG, MANIFEST, blob_path, canonical_json, put_blob, read_index

__all__ = [
    "COSIGN_IMAGE_KIND",
    "COSIGN_SIGS_KIND",
    "KeyPair",
    "VerificationError",
    "ensure_key_pair",
    "sign_blob",
    "sign_layout",
    "signature_payload",
    "verify_blob",
    "verify_layout",
]

KIND = "kind"
COSIGN_IMAGE_KIND = "dev.cosignproject.cosign/image"
COSIGN_SIGS_KIND = "dev.cosignproject.cosign/sigs"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"


class VerificationError(Exception):
    """A signature or a blob did not verify."""


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    password_file: Path

    def env(self) -> dict[str, str]:
        """The environment cosign reads the key's password from (never argv)."""
        return os.environ | {"COSIGN_PASSWORD": self.password_file.read_text().strip()}


def signing_dir() -> Path:
    if env := os.environ.get("KANRI_SIGNING_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "kanri" / "signing"


def _cosign(cosign: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cosign), *args], capture_output=True, text=True, env=env, check=False, timeout=120)


def ensure_key_pair(cosign: Path, directory: Path | None = None) -> KeyPair:
    """The platform's key pair, made on first use."""
    directory = directory or signing_dir()
    pair = KeyPair(directory / "cosign.key", directory / "cosign.pub", directory / "password")
    if pair.private.is_file() and pair.public.is_file() and pair.password_file.is_file():
        return pair
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for leftover in (pair.private, pair.public):
        leftover.unlink(missing_ok=True)
    fd = os.open(pair.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    done = _cosign(cosign, ["generate-key-pair", "--output-key-prefix", str(directory / "cosign")], pair.env())
    if done.returncode != 0:
        raise RuntimeError(f"cosign generate-key-pair failed: {done.stderr.strip()[-2000:]}")
    pair.private.chmod(0o600)
    return pair


def sign_blob(cosign: Path, pair: KeyPair, payload: Path) -> str:
    """cosign's base64 signature of the file ``payload``."""
    args = [
        "sign-blob",
        "--yes",
        "--key",
        str(pair.private),
        # the classic detached signature, no transparency log (the flags cosign 3 deprecates but keeps: its new
        # bundle format has no offline, key-only mode for sign-blob yet)
        "--tlog-upload=false",
        "--new-bundle-format=false",
        "--use-signing-config=false",
        str(payload),
    ]
    done = _cosign(cosign, args, pair.env())
    if done.returncode != 0:
        raise RuntimeError(f"cosign sign-blob failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def verify_blob(cosign: Path, public: Path, payload: Path, signature: Path) -> None:
    args = [
        "verify-blob",
        "--key",
        str(public),
        "--signature",
        str(signature),
        "--insecure-ignore-tlog=true",
        str(payload),
    ]
    done = _cosign(cosign, args)
    if done.returncode != 0:
        raise VerificationError(f"{payload.name}: {done.stderr.strip()[-1000:]}")


def signature_payload(repository: str, digest: str) -> bytes:
    """cosign's simple-signing payload for ``repository@digest`` (what ``cosign generate`` prints)."""
    payload = {
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    return canonical_json(payload)


def sign_layout(cosign: Path, pair: KeyPair, layout: Path, repository: str, digest: str, scratch: Path) -> str:
    """Signs the image ``digest`` of ``layout`` (module docstring); returns the signature manifest's digest."""
    payload = signature_payload(repository, digest)
    scratch.mkdir(parents=True, exist_ok=True)
    payload_file = scratch / "payload.json"
    payload_file.write_bytes(payload)
    signature = sign_blob(cosign, pair, payload_file)
    layer = put_blob(layout, SIMPLE_SIGNING, payload)
    config = put_blob(
        layout,
        CONFIG,
        canonical_json(
            {"architecture": "", "os": "", "config": {}, "rootfs": {"type": "layers", "diff_ids": [layer.digest]}}
        ),
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config.descriptor(),
            "layers": [layer.descriptor(annotations={SIGNATURE_ANNOTATION: signature})],
        }
    )
    sigs = put_blob(layout, MANIFEST, manifest)
    index = read_index(layout)
    index["manifests"] = [m for m in index["manifests"] if m.get("annotations", {}).get(KIND) != COSIGN_SIGS_KIND]
    index["manifests"].append(sigs.descriptor(annotations={KIND: COSIGN_SIGS_KIND}))
    (layout / "index.json").write_bytes(canonical_json(index))
    return sigs.digest


def check_blobs(layout: Path) -> None:
    """Every blob the index reaches has the digest and size its descriptor names (a changed byte fails)."""
    pending = list(read_index(layout)["manifests"])
    while pending:
        descriptor = pending.pop()
        path = blob_path(layout, descriptor["digest"])
        if not path.is_file():
            raise VerificationError(f"missing blob {descriptor['digest']}")
        sha = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
        if f"sha256:{sha.hexdigest()}" != descriptor["digest"] or path.stat().st_size != descriptor["size"]:
            raise VerificationError(f"blob {descriptor['digest']} does not match its digest or size")
        if descriptor.get("mediaType") in (MANIFEST, "application/vnd.oci.image.index.v1+json"):
            document = json.loads(path.read_bytes())
            pending += document.get("manifests", [])
            pending += [document["config"]] if "config" in document else []
            pending += document.get("layers", [])


def verify_layout(cosign: Path, public: Path, layout: Path) -> None:
    """Raises VerificationError unless the layout's blobs are intact and its image's signature verifies with
    ``public``."""
    check_blobs(layout)
    done = _cosign(
        cosign, ["verify", "--key", str(public), "--local-image", "--insecure-ignore-tlog=true", str(layout)]
    )
    if done.returncode != 0:
        raise VerificationError(f"{layout.name}: {done.stderr.strip()[-1000:]}")


def signature_of(layout: Path) -> str | None:
    """The base64 signature in ``layout``, if any (for tests and diagnostics)."""
    for entry in read_index(layout)["manifests"]:
        if entry.get("annotations", {}).get(KIND) == COSIGN_SIGS_KIND:
            manifest = json.loads(blob_path(layout, entry["digest"]).read_bytes())
            value: str = manifest["layers"][0]["annotations"][SIGNATURE_ANNOTATION]
            base64.b64decode(value)
            return value
    return None


def copy_public_key(pair: KeyPair, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pair.public, target)
