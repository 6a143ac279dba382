"""docs/cloud.md's capability matrix is the one the providers declare in code."""

from __future__ import annotations

from pathlib import Path

from kanri.cloud.policy import capability
from kanri.cloud.providers import aws, kanri

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cloud.md"


def test_the_documented_capability_matrix_is_the_code_s() -> None:
    table = capability.matrix({"aws": aws.CAPABILITIES, "kanri": kanri.CAPABILITIES})
    assert table in DOCS.read_text(), f"docs/cloud.md's capability matrix differs from the code's:\n{table}"
