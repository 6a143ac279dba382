"""Owner references and deterministic child names.

An owner reference on a child lets the garbage collector delete the child when the owner goes, and lets a controller
find its children (the informer store indexes them by owner uid). At most one reference per object may say
``controller: true``; :func:`set_owner` refuses to take over a child another controller already controls, as
controller-runtime's ``SetControllerReference`` does.

Child names are a pure function of the owner's name and a suffix, so a reconciler can find "its" child again without
remembering anything, and a re-run never creates a twin.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AlreadyOwnedError",
    "child_name",
    "controller_of",
    "is_controlled_by",
    "owner_reference",
    "set_owner",
]

Obj = dict[str, Any]

# DNS-1123 label: what Service, Pod-hostname and most other names must be (a subdomain also allows dots).
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NOT_LABEL_CHAR = re.compile(r"[^a-z0-9-]")
_HASH_LEN = 10  # 40 bits of sha256: collisions among a namespace's hashed names are vanishingly unlikely


class AlreadyOwnedError(ValueError):
    """The child already has a controller reference to a different owner."""


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def owner_reference(owner: Mapping[str, Any], *, controller: bool = True, block_owner_deletion: bool = True) -> Obj:
    """An ``ownerReference`` pointing at ``owner`` (which must have been read from the API: it needs a ``uid``).

    ``block_owner_deletion`` makes a foreground deletion of the owner wait for the child to be gone.
    """
    meta = owner.get("metadata", {})
    if not meta.get("uid"):
        raise ValueError("the owner has no metadata.uid: read or create it through the API first")
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": block_owner_deletion,
    }


def _same_object(ref: Obj, other: Obj) -> bool:
    # Group (not version: a reference written at v1beta1 still means the same object at v1), kind and name. The uid
    # is left out on purpose, so a reference to a deleted-and-recreated owner of the same name gets replaced.
    return (
        _group(str(ref.get("apiVersion", ""))) == _group(str(other.get("apiVersion", "")))
        and ref.get("kind") == other.get("kind")
        and ref.get("name") == other.get("name")
    )


def set_owner(
    child: Obj, owner: Mapping[str, Any], *, controller: bool = True, block_owner_deletion: bool = True
) -> Obj:
    """Add (or refresh) ``owner``'s reference on ``child`` in place, keeping every other reference; returns ``child``.

    Raises :class:`AlreadyOwnedError` when ``controller`` is set and another object already controls the child, and
    ``ValueError`` for a cross-namespace reference (the garbage collector would treat it as absent).
    """
    child_ns = child.get("metadata", {}).get("namespace")
    owner_ns = owner.get("metadata", {}).get("namespace")
    if child_ns and owner_ns and child_ns != owner_ns:
        raise ValueError(f"cross-namespace owner references are not allowed ({owner_ns!r} owning in {child_ns!r})")
    reference = owner_reference(owner, controller=controller, block_owner_deletion=block_owner_deletion)
    if controller and (current := controller_of(child)) is not None and not _same_object(current, reference):
        raise AlreadyOwnedError(
            f"{child.get('kind', 'object')} {child.get('metadata', {}).get('name')!r} is already controlled by "
            f"{current.get('kind')} {current.get('name')!r}"
        )
    meta = child.setdefault("metadata", {})
    others = [ref for ref in meta.get("ownerReferences") or () if not _same_object(ref, reference)]
    meta["ownerReferences"] = [*others, reference]
    return child


def controller_of(obj: Mapping[str, Any]) -> Obj | None:
    """The object's controller reference (the one with ``controller: true``), or None."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def is_controlled_by(child: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """True when ``child``'s controller reference points at exactly this ``owner`` (same uid, so not at an earlier
    object that had the same name)."""
    ref = controller_of(child)
    uid = owner.get("metadata", {}).get("uid")
    return ref is not None and bool(uid) and ref.get("uid") == uid


def child_name(owner_name: str, suffix: str = "", max_len: int = 63) -> str:
    """A deterministic DNS-1123 label for a child: ``<owner>-<suffix>`` when that is valid and fits in ``max_len``.

    Otherwise the name is lowercased, characters a label cannot hold become ``-``, it is shortened (keeping the
    suffix readable when it is short) and ``-<10 hex>`` of a sha256 over both inputs is appended: the same input
    always yields the same name, and two different inputs that need shortening do not collide (40-bit hash).
    ``max_len`` is 63 for labels (Services, Pods' hostnames); pass 253 for objects whose names may be subdomains.

    Plain names are concatenations: ``("db", "1-rw")`` and ``("db-1", "rw")`` are both ``db-1-rw``. Keep one kind's
    suffixes non-empty and dash-free, and the last dash splits every plain name uniquely.
    """
    if max_len < _HASH_LEN + 2:
        raise ValueError(f"max_len must be at least {_HASH_LEN + 2}, got {max_len}")
    if not owner_name:
        raise ValueError("owner_name must not be empty")
    plain = f"{owner_name}-{suffix}" if suffix else owner_name
    if len(plain) <= max_len and _LABEL.fullmatch(plain):
        return plain
    # The NUL separator keeps ("a-b", "c") and ("a", "b-c") apart in the hash.
    digest = hashlib.sha256(f"{owner_name}\0{suffix}".encode()).hexdigest()[:_HASH_LEN]
    room = max_len - _HASH_LEN - 1  # for the readable head, before "-<digest>"
    owner_part = _clean(owner_name)
    suffix_part = _clean(suffix)
    if suffix_part and len(suffix_part) <= room // 2:
        owner_part = owner_part[: room - len(suffix_part) - 1].strip("-")
        head = f"{owner_part}-{suffix_part}" if owner_part else suffix_part
    else:
        head = _clean(f"{owner_part}-{suffix_part}" if suffix_part else owner_part)[:room].strip("-")
    return f"{head}-{digest}" if head else digest


def _clean(text: str) -> str:
    return _NOT_LABEL_CHAR.sub("-", text.lower()).strip("-")
