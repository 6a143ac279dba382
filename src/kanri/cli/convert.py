"""``kanri convert``: PostgreSQL API manifests from one version to another, offline (no cluster needed).

For GitOps repositories and exported backups of objects: the same conversion the operator's webhook serves
(``kanri.postgres.api.conversion``), on files. Kinds it does not convert pass through unchanged; defaults the
conversion fills in are left out again, so a short manifest stays short.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml
from pydantic import ValidationError

from kanri.postgres.api.conversion import POSTGRES
from kanri.runtime import Conversion, ConversionError

__all__ = ["ConvertError", "convert", "convert_documents"]

GROUP = "kanri.dev"
Version = Literal["v1beta1", "v1alpha1"]
Output = Literal["yaml", "json"]


class ConvertError(ValueError):
    """A document that is not valid in its own version (or in no version this kanri knows)."""


def convert_documents(documents: list[Any], to: Version) -> list[Any]:
    """Each document in ``to`` when it is a kind kanri converts (``kind: List`` items included), else unchanged."""
    return [_convert_one(document, to, f"document {index + 1}") for index, document in enumerate(documents)]


def _convert_one(document: Any, to: Version, where: str) -> Any:
    if not isinstance(document, dict):
        return document
    if document.get("kind") == "List" and isinstance(document.get("items"), list):
        items = [_convert_one(item, to, f"{where} item {i + 1}") for i, item in enumerate(document["items"])]
        return {**document, "items": items}
    conversion = _conversion_of(document)
    if conversion is None:
        return document
    target = f"{GROUP}/{to}"
    try:
        defaulted = _validated(conversion, document)
        converted = conversion.convert(defaulted, target)
    except (ConversionError, ValidationError) as error:
        raise ConvertError(f"{where} ({_name_of(document)}): {error}") from error
    return _without_defaults(converted, defaulted, document)


def _conversion_of(document: dict[str, Any]) -> Conversion[Any] | None:
    group = str(document.get("apiVersion", "")).rpartition("/")[0]
    if group != GROUP:
        return None
    try:
        return POSTGRES.for_kind(group, str(document.get("kind")))
    except ConversionError:
        return None  # a kanri.dev kind of another operator: not this command's to convert


def _validated(conversion: Conversion[Any], document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with its version's defaults filled in (what the API server would store)."""
    models = {model.resource.api_version: model for model in conversion.resources}
    model = models.get(str(document.get("apiVersion")))
    if model is None:
        raise ConversionError(f"{conversion.kind} has no version {document.get('apiVersion')!r} (known: "
                              f"{', '.join(models)})")  # fmt: skip
    body = {key: value for key, value in document.items() if key != "metadata"}
    dumped: dict[str, Any] = model.model_validate(body).model_dump(mode="json", by_alias=True, exclude_none=True)
    return {**dumped, "metadata": document.get("metadata") or {}}


_MISSING: Any = object()


def _without_defaults(converted: Any, source_defaults: Any, given: Any) -> Any:
    """``converted`` without what defaulting added: a key the input did not have is dropped where its value is the
    source version's default carried over unchanged. A renamed field's default stays (it says what applies)."""
    if not isinstance(converted, dict):
        return converted
    kept: dict[str, Any] = {}
    given_map = given if isinstance(given, dict) else {}
    source_map = source_defaults if isinstance(source_defaults, dict) else {}
    for key, value in converted.items():
        default = source_map.get(key, _MISSING)
        if key in given_map:
            kept[key] = _without_defaults(value, default, given_map[key])
        elif value == default:
            continue
        elif isinstance(value, dict):
            inner = _without_defaults(value, default, {})
            if inner:
                kept[key] = inner
        else:
            kept[key] = value
    return kept


def _name_of(document: dict[str, Any]) -> str:
    metadata = document.get("metadata") or {}
    name = "/".join(str(part) for part in (metadata.get("namespace"), metadata.get("name")) if part)
    return f"{document.get('kind')} {name or '<no name>'}"


def _read(path: Path) -> Iterator[Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    return (document for document in yaml.safe_load_all(text) if document is not None)


def convert(
    filename: Annotated[
        Path,
        typer.Option(
            "-f", "--filename", help="The manifest file (multi-document YAML or JSON); - reads standard input."
        ),
    ],
    to: Annotated[Version, typer.Option("--to", help="The API version to convert kanri.dev objects to.")] = "v1beta1",
    output: Annotated[Output, typer.Option("-o", "--output", help="yaml (documents) or json (a List).")] = "yaml",
) -> None:
    """Convert PostgresCluster and PostgresBackup manifests to another API version, without a cluster.

    Other kinds pass through unchanged. A document invalid in its own version is named with the reason, and then
    nothing is written."""
    try:
        documents = convert_documents(list(_read(filename)), to)
    except (OSError, yaml.YAMLError) as error:
        raise typer.BadParameter(str(error), param_hint="-f") from error
    except ConvertError as error:
        typer.echo(f"kanri convert: {filename}: {error}", err=True)
        raise typer.Exit(1) from error
    if output == "json":
        single = documents[0] if len(documents) == 1 else {"apiVersion": "v1", "kind": "List", "items": documents}
        typer.echo(json.dumps(single, indent=2, ensure_ascii=False))
    else:
        typer.echo(yaml.safe_dump_all(documents, sort_keys=False, allow_unicode=True), nl=False)
