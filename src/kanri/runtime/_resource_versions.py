"""Ordering resourceVersions: shared by the informer (is a write ahead of the watch?) and the echo rule (is a write's
event still to come?)."""

from __future__ import annotations


def newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is later than ``b``. They are etcd revisions, compared as numbers only when both
    are decimal (an aggregated API may use other versions): otherwise no order is assumed (False)."""
    return a.isdecimal() and b.isdecimal() and int(a) > int(b)
