"""``kanri convert`` on real manifests (examples/, docs/): offline, multi-document, other kinds untouched."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kanri.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [*sorted((ROOT / "examples/postgres").glob("*.yaml")), ROOT / "examples/postgrescluster.yaml"]
runner = CliRunner()


def _kanri(*args: str, stdin: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=stdin, catch_exceptions=False)


def _documents(text: str) -> list[Any]:
    return [document for document in yaml.safe_load_all(text) if document is not None]


def _docs_backup() -> str:
    """The on-demand PostgresBackup manifest of docs/backups.md."""
    text = (ROOT / "docs/backups.md").read_text()
    blocks: list[str] = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return next(block for block in blocks if "kind: PostgresBackup" in block)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_an_example_converts_to_v1beta1_and_back_to_what_it_was(path: Path, tmp_path: Path) -> None:
    result = _kanri("convert", "-f", str(path))
    assert result.exit_code == 0, result.output
    (new,) = _documents(result.stdout)
    assert new["apiVersion"] == "kanri.dev/v1beta1"
    assert "maxDataLossBytes" not in json.dumps(new)
    converted = tmp_path / "v1beta1.yaml"
    converted.write_text(result.stdout)
    back = _kanri("convert", "-f", str(converted), "--to", "v1alpha1")
    assert back.exit_code == 0, back.output
    assert _documents(back.stdout) == _documents(path.read_text())


def test_a_byte_count_becomes_a_quantity_and_defaults_stay_out(tmp_path: Path) -> None:
    manifest = tmp_path / "db.yaml"
    spec = "{version: 17, storage: {size: 1Gi}, failover: {maxDataLossBytes: 1073741824}}"
    manifest.write_text(
        f"apiVersion: kanri.dev/v1alpha1\nkind: PostgresCluster\nmetadata: {{name: db}}\nspec: {spec}\n"
    )
    result = _kanri("convert", "-f", str(manifest))
    (new,) = _documents(result.stdout)
    assert new["apiVersion"] == "kanri.dev/v1beta1"
    assert new["spec"] == {"version": 17, "storage": {"size": "1Gi"}, "failover": {"maxDataLoss": "1Gi"}}


def test_other_kinds_pass_through_unchanged_in_a_multi_document_file(tmp_path: Path) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"}, "stringData": {"key": "v"}}
    greeting = {"apiVersion": "example.kanri.dev/v1alpha1", "kind": "Greeting", "metadata": {"name": "hi"},
                "spec": {"text": "hello"}}  # fmt: skip
    cache = {"apiVersion": "kanri.dev/v1alpha1", "kind": "Cache", "metadata": {"name": "c"}, "spec": {"x": 1}}
    cluster = (ROOT / "examples/postgres/minimal.yaml").read_text()
    manifest = tmp_path / "all.yaml"
    manifest.write_text("\n---\n".join([yaml.safe_dump(secret), cluster, yaml.safe_dump(greeting),
                                         _docs_backup(), yaml.safe_dump(cache)]))  # fmt: skip
    result = _kanri("convert", "-f", str(manifest), "-o", "json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert listed["kind"] == "List"
    out_secret, out_cluster, out_greeting, out_backup, out_cache = listed["items"]
    assert (out_secret, out_greeting, out_cache) == (secret, greeting, cache)
    assert out_cluster["apiVersion"] == out_backup["apiVersion"] == "kanri.dev/v1beta1"
    assert out_backup["spec"] == {"cluster": "orders"}


def test_standard_input_and_a_list_are_converted(tmp_path: Path) -> None:
    cluster = _documents((ROOT / "examples/postgres/minimal.yaml").read_text())[0]
    exported = {"apiVersion": "v1", "kind": "List", "items": [cluster]}  # `kubectl get -o yaml` exports a List
    result = _kanri("convert", "-f", "-", "-o", "json", stdin=json.dumps(exported))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["items"][0]["apiVersion"] == "kanri.dev/v1beta1"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("{version: 12, storage: {size: 1Gi}}", "version"),
        ("{version: 17, storage: {size: 1Gi}, failover: {maxDataLossBytes: -1}}", "maxDataLossBytes"),
        ("{version: 17, storage: {size: 1Gi}, typo: 1}", "typo"),
    ],
)
def test_an_invalid_object_is_named_with_the_reason_and_nothing_is_written(
    tmp_path: Path, spec: str, says: str
) -> None:
    manifest = tmp_path / "bad.yaml"
    good = (ROOT / "examples/postgres/minimal.yaml").read_text()
    manifest.write_text(f"{good}\n---\napiVersion: kanri.dev/v1alpha1\nkind: PostgresCluster\n"
                        f"metadata: {{name: bad, namespace: prod}}\nspec: {spec}\n")  # fmt: skip
    result = runner.invoke(app, ["convert", "-f", str(manifest)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "document 2 (PostgresCluster prod/bad)" in result.stderr
    assert says in result.stderr


def test_a_version_kanri_does_not_know_is_an_error(tmp_path: Path) -> None:
    manifest = tmp_path / "v9.yaml"
    manifest.write_text("apiVersion: kanri.dev/v9\nkind: PostgresCluster\nmetadata: {name: db}\nspec: {}\n")
    result = runner.invoke(app, ["convert", "-f", str(manifest), "--to", "v1alpha1"])
    assert result.exit_code == 1
    assert "no version 'kanri.dev/v9'" in result.stderr
