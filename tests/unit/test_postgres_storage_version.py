"""KANRI_STORAGE_VERSION picks the versions the operator serves, and an operator without the webhook refuses to take
the CRDs back to v1alpha1 alone while the API server lists another stored version (kanri.postgres.versions.storage)."""

from __future__ import annotations

import pytest

from kanri.postgres.api.conversion import POSTGRES
from kanri.postgres.api.served import SERVED
from kanri.postgres.versions import (
    STORAGE_VERSION_ENV,
    StorageVersionRefused,
    check_single_version,
    versions_from_environment,
)


def test_unset_or_empty_keeps_v1alpha1_stored_and_v1beta1_selects_the_migration_target() -> None:
    assert versions_from_environment({}) is SERVED
    assert versions_from_environment({STORAGE_VERSION_ENV: ""}) is SERVED
    assert versions_from_environment({STORAGE_VERSION_ENV: "v1alpha1"}) is SERVED
    assert versions_from_environment({STORAGE_VERSION_ENV: "v1beta1"}) is POSTGRES


def test_an_unknown_storage_version_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(StorageVersionRefused, match=r"KANRI_STORAGE_VERSION='v1'.*v1alpha1, v1beta1"):
        versions_from_environment({STORAGE_VERSION_ENV: "v1"})


def _crd(name: str, stored: list[str] | None) -> dict[str, object]:
    return {"metadata": {"name": name}, "status": {} if stored is None else {"storedVersions": stored}}


def test_the_webhook_may_go_once_nothing_is_stored_in_v1beta1() -> None:
    check_single_version([])
    check_single_version([_crd("postgresclusters.kanri.dev", ["v1alpha1"]), _crd("postgresbackups.kanri.dev", None)])


@pytest.mark.parametrize("stored", [["v1beta1"], ["v1alpha1", "v1beta1"]])
def test_turning_the_webhook_off_is_refused_while_objects_may_be_stored_in_v1beta1(stored: list[str]) -> None:
    crds = [_crd("postgresclusters.kanri.dev", ["v1alpha1"]), _crd("postgresbackups.kanri.dev", stored)]
    with pytest.raises(StorageVersionRefused) as refused:
        check_single_version(crds)
    message = str(refused.value)
    assert "postgresbackups.kanri.dev has objects stored in v1beta1" in message
    assert "conversionWebhook.storageVersion=v1alpha1" in message
