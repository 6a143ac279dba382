"""``kanri convert``: PostgreSQL API manifests from one version to another, offline (no cluster needed).

For GitOps repositories and exported backups of objects: the same conversion the operator's webhook serves
(``kanri.postgres.api.conversion``), on files. Kinds it does not convert pass through unchanged; defaults the
conversion fills in are left out again (a field the input did not name, at its default), so a short manifest stays
short.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
import yaml
from pydantic import BaseModel, ValidationError

from kanri.postgres.api.conversion import POSTGRES
from kanri.runtime import Conversion, ConversionError, CustomResource

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
    source = _model(conversion, str(document.get("apiVersion")))
    return _without_defaults(converted, _model(conversion, target), source, document)


def _conversion_of(document: dict[str, Any]) -> Conversion[Any] | None:
    group = str(document.get("apiVersion", "")).rpartition("/")[0]
    if group != GROUP:
        return None
    try:
        return POSTGRES.for_kind(group, str(document.get("kind")))
    except ConversionError:
        return None  # a kanri.dev kind of another operator: not this command's to convert


def _model(conversion: Conversion[Any], api_version: str) -> type[CustomResource]:
    models = {model.resource.api_version: model for model in conversion.resources}
    model = models.get(api_version)
    if model is None:
        raise ConversionError(f"{conversion.kind} has no version {api_version!r} (known: {', '.join(models)})")
    return model


def _validated(conversion: Conversion[Any], document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with its version's defaults filled in (what the API server would store)."""
    model = _model(conversion, str(document.get("apiVersion")))
    body = {key: value for key, value in document.items() if key != "metadata"}
    dumped: dict[str, Any] = model.model_validate(body).model_dump(mode="json", by_alias=True, exclude_none=True)
    return {**dumped, "metadata": document.get("metadata") or {}}


def _without_defaults(
    converted: dict[str, Any], target: type[BaseModel], source: type[BaseModel] | None, given: Any
) -> dict[str, Any]:
    """``converted`` without what defaulting added, so a short manifest stays short: a field the input did not name
    is left out where its value is the field's default in ``target`` (the target version's model). A renamed field
    keeps its value when the input named the field it came from (a key ``target`` does not know at that level)."""
    fields, source_fields = _fields(target), _fields(source)
    given_map = given if isinstance(given, dict) else {}
    renamed_here = any(key not in fields for key in given_map)
    kept: dict[str, Any] = {}
    for key, value in converted.items():
        field = fields.get(key)
        if field is None or key in given_map or (renamed_here and key not in source_fields):
            kept[key] = value
            continue
        if not field.is_required() and value == _wire(field.get_default(call_default_factory=True)):
            continue
        kept[key] = value
    for key, value in kept.items():
        inner = next(iter(_models_in(fields[key].annotation)), None) if key in fields else None
        if isinstance(value, dict) and inner is not None and key in given_map:
            source_inner = next(iter(_models_in(source_fields[key].annotation)), None) if key in source_fields else None
            kept[key] = _without_defaults(value, inner, source_inner, given_map[key])
    return kept


def _fields(model: type[BaseModel] | None) -> dict[str, Any]:
    return {field.alias or name: field for name, field in model.model_fields.items()} if model else {}


def _wire(default: Any) -> Any:
    return (
        default.model_dump(mode="json", by_alias=True, exclude_none=True) if isinstance(default, BaseModel) else default
    )


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation names (``Failover``, ``Backup | None``); none for lists and maps."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Union, UnionType):
        return [model for arg in get_args(annotation) for model in _models_in(arg)]
    return []


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
