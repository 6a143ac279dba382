"""The PostgreSQL docs' lists checked against the code, so a list cannot drift from what kanri does.

docs/observability.md: the runtime, operator and instance exporter metric tables against the registered metrics (names,
types, labels), the alert table against deploy/monitoring/alerts.yaml (name, for, severity). docs/postgrescluster.md:
the spec table against PostgresClusterSpec both ways, the status table against PostgresClusterStatus.
docs/instance-manager.md: the HTTP API table against http_api.py's routes, the problem table against
kanri.contract.problems.REASONS. The chart README's values table against values.yaml. On every PostgreSQL page: each
``kanri_postgres_*``/``kanri_instance_*`` metric named exists, each flag given to a PostgreSQL ``kanri`` command is
one it has, and each file and test named exists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from kanri.cli.main import app
from kanri.contract.problems import REASONS
from kanri.instance import exporter
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec, PostgresClusterStatus
from kanri.postgres.backup.archiving import BackupMetrics
from kanri.postgres.metrics import PostgresMetrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OBSERVABILITY = DOCS / "observability.md"
PAGES = [
    DOCS / "postgrescluster.md",
    DOCS / "backups.md",
    DOCS / "instance-manager.md",
    OBSERVABILITY,
    DOCS / "security.md",
    DOCS / "install.md",
    DOCS / "helm.md",
    DOCS / "postgres-operator.md",
    ROOT / "deploy" / "helm" / "kanri" / "README.md",
    ROOT / "README.md",
]
_SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}


def section(text: str, start: str) -> str:
    """The text from the line holding ``start`` to the next blank line after its table."""
    lines = text[text.index(start) :].splitlines()
    table = [i for i, line in enumerate(lines) if line.startswith("|")]
    return "\n".join(lines[table[0] : next(i for i in range(table[0], len(lines)) if not lines[i].startswith("|"))])


def rows(table: str) -> list[list[str]]:
    """A markdown table's body rows, cells stripped (header and rule left out)."""
    body = table.splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body]


def names(cell: str) -> list[str]:
    """The `code` names of one cell (a row may list two metrics)."""
    return re.findall(r"`([a-z_:][a-z0-9_:]*)`", cell)


def operator_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """kanri_postgres_* name as scraped (counters with _total) -> (type, labels), from the operator's classes."""
    registry = CollectorRegistry()
    PostgresMetrics(registry)
    BackupMetrics(registry)
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for collector in list(registry._collector_to_names):  # private, but the only place labels are kept
        labels = tuple(getattr(collector, "_labelnames", ()))
        for family in collector.describe() if hasattr(collector, "describe") else []:
            suffix = "_total" if family.type == "counter" else ""
            found[family.name + suffix] = (family.type, labels)
    return found


def every_metric() -> set[str]:
    """Every sample name kanri's PostgreSQL operator and instance exporter expose, with their suffixes."""
    found: set[str] = set()
    for name, (kind, _) in operator_metrics().items():
        base = name.removesuffix("_total")
        found |= {base + suffix for suffix in _SUFFIXES.get(kind, [""])}
    found |= {name for name, _, _ in exporter.described()}
    return found


def test_the_operator_metric_table_is_what_the_operator_registers() -> None:
    table = section(OBSERVABILITY.read_text(), "**PostgreSQL operator**")
    documented: dict[str, tuple[str, ...]] = {}
    for metric, labels, _ in rows(table):
        for name in names(metric):
            documented[name] = tuple(label.strip() for label in labels.split(","))
    code = operator_metrics()
    assert set(documented) == set(code), (
        f"in the code, not in docs/observability.md: {sorted(set(code) - set(documented))}; "
        f"documented, not in the code: {sorted(set(documented) - set(code))}"
    )
    wrong = {name: (labels, code[name][1]) for name, labels in documented.items() if labels != code[name][1]}
    assert not wrong, f"labels differ (docs, code): {wrong}"


def test_the_instance_exporter_table_is_what_the_exporter_renders() -> None:
    table = section(OBSERVABILITY.read_text(), "**Instance exporter**")
    documented: dict[str, tuple[str, tuple[str, ...]]] = {}
    for metric, kind, extra, _ in rows(table):
        labels = tuple(re.sub(r"\s*\(.*?\)", "", extra).replace(" ", "").split(",")) if extra else ()
        for name in names(metric):
            documented[name] = (kind, labels)
    code = {name: (kind, labels[len(exporter.BASE_LABELS) :]) for name, kind, labels in exporter.described()}
    assert set(documented) == set(code), (
        f"rendered, not in docs/observability.md: {sorted(set(code) - set(documented))}; "
        f"documented, not rendered: {sorted(set(documented) - set(code))}"
    )
    wrong = {name: (doc, code[name]) for name, doc in documented.items() if doc != code[name]}
    assert not wrong, f"type or labels differ (docs, code): {wrong}"


def test_every_kanri_metric_a_postgres_page_names_exists() -> None:
    known = every_metric()
    unknown = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in PAGES
        for name in re.findall(r"\bkanri_(?:postgres|instance)_[a-z0-9_]+", page.read_text())
        if name not in known and not name.endswith("_")  # a family, `kanri_postgres_instance_*`
    }
    assert not unknown, f"metrics the docs name that no code exposes: {sorted(unknown)}"


def alerts() -> dict[str, tuple[str, str]]:
    """alert -> (for, severity) of deploy/monitoring/alerts.yaml."""
    document: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "monitoring" / "alerts.yaml").read_text())
    return {
        rule["alert"]: (rule.get("for", "—"), rule["labels"]["severity"])
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_the_alert_table_is_every_alert_with_its_for_and_severity() -> None:
    table = section(OBSERVABILITY.read_text(), "| alert | seed row |")
    documented = {}
    for alert, _, _, wait, severity in rows(table):
        name = re.fullmatch(r"\[(\w+)\]\(runbooks/\1\.md\)", alert)
        assert name, f"{alert!r} does not link its runbook as [Alert](runbooks/Alert.md)"
        documented[name[1]] = (wait, severity)
    assert documented == alerts()


def test_the_backup_alert_table_names_only_real_alerts() -> None:
    table = section(OBSERVABILITY.read_text(), "| alert | fires when | why this threshold |")
    assert {row[0] for row in rows(table)} <= set(alerts())


COMMANDS = ("run", "status", "promote", "restart", "restore-test", "backup", "hibernate", "wake", "psql", "convert")
"""The PostgreSQL commands of the CLI whose flags the pages quote."""


def command_flags() -> dict[str, set[str]]:
    """Each command's options (long and short, both spellings of a boolean)."""
    import typer.main

    group = typer.main.get_command(app)
    return {
        name: {
            opt
            for param in group.commands[name].params  # type: ignore[attr-defined]
            for opt in (*param.opts, *param.secondary_opts)
            if opt.startswith("-")
        }
        for name in COMMANDS
    }


def test_every_flag_the_docs_give_a_postgres_command_exists() -> None:
    flags = command_flags()
    wrong = set()
    for page in PAGES:
        for name, rest in re.findall(rf"kanri ({'|'.join(COMMANDS)})\b([^`\n]*)", page.read_text()):
            quoted = rest.split(" -- ")[0]  # after `--`: psql's own arguments
            for flag in re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", quoted):
                if flag not in flags[name]:
                    wrong.add(f"{page.relative_to(ROOT)}: kanri {name} {flag}")
    assert not wrong, f"flags the docs name that the command does not have: {sorted(wrong)}"


def field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field path of a model by its JSON names (camelCase), nested models included."""
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        paths.add(path)
        for inner in _models(field.annotation):
            paths |= field_paths(inner, path + ".")
    return paths


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models(arg)]


def table_fields() -> set[str]:
    """The spec fields docs/postgrescluster.md's table has a row for."""
    table = section((DOCS / "postgrescluster.md").read_text(), "| field |")
    return {
        cell
        for row in rows(table)
        if not row[0].startswith("any other")  # the row about unknown keys
        for cell in re.findall(r"`([a-zA-Z][\w.]*)`", row[0])
    }


def test_every_field_in_the_postgrescluster_table_exists() -> None:
    unknown = table_fields() - field_paths(PostgresClusterSpec)
    assert not unknown, f"fields in docs/postgrescluster.md that PostgresClusterSpec does not have: {sorted(unknown)}"


def test_the_postgrescluster_table_has_a_row_for_every_spec_field() -> None:
    # A field is covered by its own row, by a row of an enclosing object (`backup.repository.s3.credentialsSecret`
    # covers its keys; `podTemplate.affinity` is core/v1's Affinity) or by rows of its own fields (`backup`).
    documented = table_fields()
    missing = sorted(
        path
        for path in field_paths(PostgresClusterSpec)
        if path not in documented
        and not any(path.startswith(row + ".") or row.startswith(path + ".") for row in documented)
    )
    assert not missing, f"spec fields docs/postgrescluster.md's table has no row for: {missing}"


def test_the_status_table_has_a_row_for_every_status_field() -> None:
    table = section((DOCS / "postgrescluster.md").read_text(), "| field | meaning |")
    documented = {name for row in rows(table) for name in re.findall(r"^`(\w+)(?:\[\])?`$", row[0])}
    fields = {field.alias or name for name, field in PostgresClusterStatus.model_fields.items()}
    assert documented == fields, (
        f"no row: {sorted(fields - documented)}; not a status field: {sorted(documented - fields)}"
    )


def test_every_instance_api_route_is_in_the_instance_manager_page() -> None:
    code = set(re.findall(r"add_(get|post)\(\"([^\"]+)\"", (ROOT / "src/kanri/instance/http_api.py").read_text()))
    assert len(code) > 10, code  # the routes are still registered this way
    page = (DOCS / "instance-manager.md").read_text()
    table = section(page, "| request | answer |")
    documented = {
        (method.lower(), path) for row in rows(table) for method, path in re.findall(r"`(GET|POST) (/[^`]*)`", row[0])
    }
    assert documented == code, f"no row: {sorted(code - documented)}; no route: {sorted(documented - code)}"


def test_the_instance_problem_table_is_the_contracts_reasons() -> None:
    table = section((DOCS / "instance-manager.md").read_text(), "| reason | meaning |")
    documented = {name for row in rows(table) for name in re.findall(r"^`(\w+)`$", row[0])}
    assert documented == set(REASONS)


def test_every_file_and_test_a_postgres_page_names_exists() -> None:
    tests = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    defined = {
        name for path in (ROOT / "tests").rglob("test_*.py") for name in re.findall(r"def (test_\w+)", path.read_text())
    }
    missing = set()
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(ROOT)
        for path in re.findall(r"\b(?:tests|src|deploy|docs|hack|bench)/[\w./-]+\.(?:py|md|yaml|json|sh|tpl)", text):
            if not (ROOT / path).exists():
                missing.add(f"{where}: {path}")
        missing |= {f"{where}: {name}" for name in re.findall(r"\b(test_\w+\.py)", text) if name not in tests}
        missing |= {f"{where}: {name}" for name in re.findall(r"::(test_\w+)", text) if name not in defined}
    assert not missing, f"named in the docs, not in the tree: {sorted(missing)}"


CHART = ROOT / "deploy" / "helm" / "kanri"
WHOLE_VALUES = {"resources", "podSecurityContext", "securityContext", "defaultRepository", "digests", "upgradeDigests"}
"""Values the README describes as one (a map the chart passes on as it is)."""


def value_paths(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Each value's dotted path; a non-empty map is described by its keys, except those passed on whole."""
    paths: set[str] = set()
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in WHOLE_VALUES:
            paths |= value_paths(value, f"{prefix}{key}.")
        else:
            paths.add(prefix + key)
    return paths


def test_the_chart_readme_has_a_row_for_every_value() -> None:
    table = section((CHART / "README.md").read_text(), "| value | default | what |")
    documented: set[str] = set()
    for row in rows(table):
        names = re.findall(r"`([\w.]+)`", row[0])
        for name in names:
            # `postgres.registry`, `.repository`: a leading dot continues the first name's parent
            documented.add(names[0].rsplit(".", 1)[0] + name if name.startswith(".") else name)
    values = value_paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert documented == values, f"no row: {sorted(values - documented)}; no value: {sorted(documented - values)}"


def test_the_runtime_metric_table_is_what_the_runtime_registers() -> None:
    from tests.unit.test_monitoring import registered

    code = {
        re.sub(r"_(bucket|sum|count)$", "", name): labels - {"le"}
        for name, labels in registered().items()
        # the PgBouncer agent's series are docs/pooler.md's table (tests/unit/test_pooler_alerts.py checks it)
        if not name.startswith(("kanri_postgres_", "kanri_instance_", "kanri_pgbouncer_"))
    }
    table = section(OBSERVABILITY.read_text(), "**Runtime**")
    documented = {}
    for metric, _, labels, _ in rows(table):
        for name in names(metric):
            documented[name] = {label.strip().split(" ")[0] for label in re.sub(r"\(.*?\)", "", labels).split(",")}
    assert set(documented) == set(code), (
        f"registered, not in docs/observability.md: {sorted(set(code) - set(documented))}; "
        f"documented, not registered: {sorted(set(documented) - set(code))}"
    )
    wrong = {name: (labels, code[name]) for name, labels in documented.items() if labels != code[name]}
    assert not wrong, f"labels differ (docs, code): {wrong}"
