"""Renewing a cluster's CA before it expires, without a failed handshake: the pure part.

The CA signs the server certificate; clients, the replicas and the operator verify with the published ``ca.crt``.
Replacing the CA in one step would fail every handshake between the moment a server presents a certificate of the
new CA and the moment its verifier holds the new CA (a kubelet updates mounted Secrets up to a minute or so later).
So the rotation has three phases, recorded on ``<cluster>-ca-key`` (annotations :data:`PHASE` and :data:`SINCE`, the
old CA kept beside the new one as ``previous.crt``/``previous.key``), so an operator restarted in between carries on:

1. **steady** and the CA has less than a third of its lifetime left (:func:`due`) → **trusting**: a new CA is made;
   the trust bundle (``ca.crt`` of ``<cluster>-ca`` and of ``<cluster>-server``) holds the new and the old CA; the
   server certificate stays signed by the old one (the old key still signs, should it need reissuing).
2. **trusting** for :attr:`TlsSettings.rotation_settle` → **reissued**: the server certificate is reissued by the new
   CA; the bundle still holds both (a verifier that has not re-read its files yet still trusts the old one).
3. **reissued** for ``rotation_settle`` → **steady**: the old CA leaves the bundle and the key Secret.

Every verifier trusts both CAs whenever a certificate of either is served, so no handshake fails, provided
``rotation_settle`` covers how long mounted files take to change (default 5 minutes) and the old CA outlives the two
phases (a third of its lifetime: years for the default 10-year CA).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from cryptography import x509

from kanri.postgres.tls.certificates import CA_LIFETIME

__all__ = [
    "PHASE",
    "PREVIOUS_CERT",
    "PREVIOUS_KEY",
    "ROTATION_SETTLE",
    "SINCE",
    "Phase",
    "TlsSettings",
    "bundle",
    "due",
    "next_step",
]

PHASE = "kanri.dev/ca-rotation"
"""On ``<cluster>-ca-key`` while a rotation runs: ``trusting`` or ``reissued``."""
SINCE = "kanri.dev/ca-rotation-since"
"""On ``<cluster>-ca-key``: when the current phase began (RFC 3339, UTC)."""
PREVIOUS_CERT = "previous.crt"
PREVIOUS_KEY = "previous.key"
ROTATION_SETTLE = dt.timedelta(minutes=5)
"""How long each phase lasts: longer than a kubelet takes to update a mounted Secret."""
RENEW_FRACTION = 1 / 3

Phase = Literal["steady", "trusting", "reissued"]
Step = Literal["none", "start", "reissue", "finish"]


@dataclass(frozen=True)
class TlsSettings:
    """The operator's TLS knobs (``OperatorOptions``; tests shorten both)."""

    ca_lifetime: dt.timedelta = CA_LIFETIME
    """How long a CA the operator makes is valid."""
    rotation_settle: dt.timedelta = ROTATION_SETTLE
    """How long each phase of a CA rotation lasts."""


def due(ca_pem: bytes, now: dt.datetime) -> bool:
    """The CA has less than a third of its lifetime left (an unreadable one is reported elsewhere, never rotated)."""
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return False
    start, end = ca.not_valid_before_utc, ca.not_valid_after_utc
    return end - now < (end - start) * RENEW_FRACTION


def next_step(phase: Phase, since: dt.datetime | None, ca_due: bool, now: dt.datetime, settle: dt.timedelta) -> Step:
    """What the rotation does this pass: start one (the CA is due), reissue the server certificate with the new CA,
    finish (drop the old CA), or nothing."""
    if phase == "steady":
        return "start" if ca_due else "none"
    if since is None or now - since < settle:
        return "none"  # (a phase without a time is stamped by the step, and counts from then)
    return "reissue" if phase == "trusting" else "finish"


def bundle(current: bytes, previous: bytes | None) -> bytes:
    """The trust bundle: the current CA, then the previous one while a rotation keeps it."""
    if not previous:
        return current
    return current.rstrip(b"\n") + b"\n" + previous
