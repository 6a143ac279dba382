"""A v1alpha1 resource's declaration as class keywords for its v1beta1 twin (every kind keeps its group, kind,
names, categories and printer columns across the two versions; only the version differs)."""

from __future__ import annotations

from typing import Any

from kanri.runtime import CustomResource

VERSION = "v1beta1"


def v1beta1_of(model: type[CustomResource]) -> dict[str, Any]:
    """``model``'s resource declaration (its v1alpha1 class) with the version set to v1beta1."""
    info = model.resource
    return {
        "group": info.group,
        "version": VERSION,
        "kind": info.kind,
        "plural": info.plural,
        "short_names": info.short_names,
        "categories": info.categories,
        "printer_columns": info.printer_columns,
    }
