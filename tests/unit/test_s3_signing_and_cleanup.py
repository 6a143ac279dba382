"""Pure parts of deleting a cluster's backups: SigV4 signing (AWS's published GET Object example), the request body,
the cluster's key prefix and the retry backoff."""

from __future__ import annotations

import hashlib
import hmac
from xml.etree import ElementTree

from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.archiving import Repository
from kanri.postgres.backup.cleanup import backoff, is_upgraded_system_key, prefix
from kanri.postgres.backup.s3 import canonical_request, delete_body, signing_key

EMPTY = hashlib.sha256(b"").hexdigest()


def test_signature_matches_the_aws_example_for_get_object() -> None:
    headers = {"host": "examplebucket.s3.amazonaws.com", "range": "bytes=0-9", "x-amz-content-sha256": EMPTY,
               "x-amz-date": "20130524T000000Z"}  # fmt: skip
    request, signed = canonical_request("GET", "/test.txt", {}, headers, EMPTY)
    assert signed == "host;range;x-amz-content-sha256;x-amz-date"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", "20130524T000000Z", "20130524/us-east-1/s3/aws4_request",
                         hashlib.sha256(request.encode()).hexdigest()])  # fmt: skip
    key = signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524", "us-east-1")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    assert signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"


def test_query_is_sorted_and_encoded_in_the_canonical_request() -> None:
    request, _ = canonical_request("GET", "/b", {"prefix": "dev/orders/", "list-type": "2", "delete": ""},
                                   {"host": "h"}, EMPTY)  # fmt: skip
    assert request.splitlines()[2] == "delete=&list-type=2&prefix=dev%2Forders%2F"


def test_delete_body_lists_every_key_quietly() -> None:
    root = ElementTree.fromstring(delete_body(["a/1", "a/<2>&"]))
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    assert root.findtext(f"{ns}Quiet") == "true"
    assert [k.text for k in root.iter(f"{ns}Key")] == ["a/1", "a/<2>&"]


def _repository(path: str | None, tenant: str | None = None) -> Repository:
    s3 = S3Repository.model_validate({"endpoint": "http://s3:8333", "bucket": "kanri-backups", "path": path,
                                      "credentialsSecret": {"name": "keys"}})  # fmt: skip
    return Repository(s3, "kanri-system", default=True, tenant=tenant)


def test_prefix_is_the_clusters_own_folder_with_a_trailing_slash() -> None:
    assert prefix(_repository("dev"), "orders") == "dev/orders/"
    assert prefix(_repository("prod/eu"), "orders") == "prod/eu/orders/"
    assert prefix(_repository(None), "orders") == "orders/"
    # the platform's default repository: a folder per namespace
    assert prefix(_repository("dev", "shop"), "orders") == "dev/shop/orders/"
    assert prefix(_repository(None, "shop"), "orders") == "shop/orders/"


def test_delete_takes_the_folders_of_the_clusters_upgraded_systems_and_no_neighbours() -> None:
    repository = _repository("dev", "shop")
    assert is_upgraded_system_key("dev/shop/orders.pg15/wals/0000000100000000/x.gz", repository, "orders")
    assert is_upgraded_system_key("dev/shop/orders.pg18/base/20261201T000000/backup.info", repository, "orders")
    for other in ("dev/shop/orders.pgx/wals/a", "dev/shop/orders.pg15x/a", "dev/shop/orders-archive.pg15/a",
                  "dev/other/orders.pg15/a", "dev/shop/orders/wals/a"):  # fmt: skip
        assert not is_upgraded_system_key(other, repository, "orders"), other


def test_backoff_doubles_from_two_seconds_up_to_five_minutes() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff(20) == 300.0
