"""kanri.kit.image_for / image_table: the chart's table of workload images by version, else the local name."""

from __future__ import annotations

import pytest

from kanri.kit import image_for, image_table

ENV = "KANRI_TEST_IMAGES"


def test_a_listed_version_runs_the_tables_reference_and_any_other_the_local_name() -> None:
    pinned = "registry.example/kanri-kafka:4.4.0@sha256:" + "a" * 64
    environ = {ENV: '{"4.4.0": "' + pinned + '"}'}
    assert image_for(ENV, "kanri.dev/kafka", "4.4.0", environ) == pinned
    assert image_for(ENV, "kanri.dev/kafka", "4.5.0", environ) == "kanri.dev/kafka:4.5.0"
    assert image_for(ENV, "kanri.dev/kafka", "4.4.0", {}) == "kanri.dev/kafka:4.4.0"
    assert image_for(ENV, "kanri.dev/kafka", "4.4.0", {ENV: " "}) == "kanri.dev/kafka:4.4.0"


@pytest.mark.parametrize("text", ["not json", '["4.4.0"]', '{"4.4.0": 1}', '{"4.4.0": ""}'])
def test_a_malformed_table_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=ENV):
        image_table(ENV, {ENV: text})
