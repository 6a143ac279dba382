"""deploy/crds/ holds exactly what the API models generate: a stale file fails CI with the command that fixes it."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from kanri.cli.crds import rendered
from kanri.cli.main import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "crds"
FIX = "run `make crds` (or `.venv/bin/kanri crds --dir deploy/crds`) and commit the result"


def test_committed_crds_match_the_generator() -> None:
    expected = rendered()
    for name, text in expected.items():
        path = DEPLOY / name
        assert path.exists(), f"deploy/crds/{name} is missing: {FIX}"
        assert path.read_text() == text, f"deploy/crds/{name} is stale (the API models changed): {FIX}"


def test_no_leftover_crd_files() -> None:
    leftovers = sorted(path.name for path in DEPLOY.glob("*.yaml") if path.name not in rendered())
    assert leftovers == [], f"deploy/crds/ holds files no model generates: {leftovers}; delete them"


def test_printed_crds_are_one_yaml_document_each() -> None:
    result = CliRunner().invoke(app, ["crds"])
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.output))
    assert [doc["metadata"]["name"] for doc in documents] == [name.removesuffix(".yaml") for name in rendered()]
