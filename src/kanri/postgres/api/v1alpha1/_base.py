"""The base of this API's models: KubeModel with descriptions reflowed for ``kubectl explain``."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ConfigDict

from kanri.runtime import KubeModel

__all__ = ["ApiModel", "cel_list", "reflow_descriptions"]

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def reflow(text: str) -> str:
    """Join the lines of each paragraph: docstrings wrap at 120 columns, and kubectl explain wraps again, so kept
    line breaks would leave ragged text. Blank lines still separate paragraphs."""
    paragraphs = _PARAGRAPH_BREAK.split(text.strip())
    return "\n\n".join(" ".join(line.strip() for line in paragraph.splitlines()) for paragraph in paragraphs)


def reflow_descriptions(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` hook: reflow the model's description and those of its fields."""
    nodes = [schema, *schema.get("properties", {}).values()]
    for node in nodes:
        if isinstance(node.get("description"), str):
            node["description"] = reflow(node["description"])


def cel_list(names: tuple[str, ...]) -> str:
    """A CEL list literal of plain names (no quotes or backslashes in them): ``['a', 'b']``."""
    return "[" + ", ".join(f"'{name}'" for name in names) + "]"


class ApiModel(KubeModel):
    """KubeModel whose docstrings become reflowed CRD descriptions."""

    model_config = ConfigDict(json_schema_extra=reflow_descriptions)
