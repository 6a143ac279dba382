"""The two S3 calls the operator makes itself — list the keys under a prefix, delete them — signed with AWS Signature
Version 4 over the aiohttp the operator already has.

Why not boto3 or aiobotocore: both (1.44.5 and 3.10.0) need ``python-dateutil<3`` while the lock holds 4.0.0, and the
operator needs nothing else of them; the archiving and base backups stay with Barman Cloud in the pods. Path-style
addressing (``<endpoint>/<bucket>/<key>``), as barman is told to use. Keys never appear in a URL, a log or an
exception: only the signature derived from them travels, in the ``Authorization`` header.

The endpoint may be a tenant's (``spec.backup.repository.s3.endpoint``), so nothing it answers is trusted to end
(issue 33): every request has a connect and a total deadline, an answer's body is read up to :data:`MAX_BODY` and
refused beyond, and :meth:`S3Client.list_keys` stops after ``max_pages`` pages or ``deadline`` seconds. Each limit
fails with an :class:`S3Error` naming the limit (never a key).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import aiohttp
from yarl import URL

__all__ = [
    "LIST_DEADLINE",
    "MAX_BODY",
    "MAX_PAGES",
    "S3Client",
    "S3Error",
    "S3Keys",
    "canonical_request",
    "signing_key",
]

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_BATCH = 1000
"""DeleteObjects takes at most 1000 keys per request."""
MAX_BODY = 8 * 1024 * 1024
"""The largest answer read (bytes): a ListObjectsV2 page of 1000 keys of 1 KiB each is about 1.2 MiB."""
MAX_PAGES = 1000
"""ListObjectsV2 pages one listing may take (a million keys: 16 TB of WAL segments)."""
LIST_DEADLINE = 300.0
"""Seconds one listing may take, all pages together."""


class S3Error(Exception):
    """A request the server refused or that could not be made; the message names the operation and the status or
    the server's error code, never a key."""


@dataclass(frozen=True)
class S3Keys:
    access_key_id: str
    secret_access_key: str = field(repr=False)


def _encode(text: str, safe: str) -> str:
    return quote(text, safe=safe)


def canonical_request(method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                      payload_sha256: str) -> tuple[str, str]:  # fmt: skip
    """SigV4's canonical request and its signed-header list. ``path`` is already URI-encoded; header names are
    lower-case."""
    canonical_query = "&".join(
        f"{_encode(k, '-_.~')}={_encode(v, '-_.~')}" for k, v in sorted(query.items())
    )  # fmt: skip
    names = sorted(headers)
    canonical_headers = "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in names)
    signed = ";".join(names)
    return "\n".join([method, path, canonical_query, canonical_headers, signed, payload_sha256]), signed


def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


class S3Client:
    """List and delete objects of one bucket; use as ``async with S3Client(...) as s3``."""

    def __init__(self, endpoint: str, keys: S3Keys, region: str = "us-east-1", timeout: float = 30,
                 connect_timeout: float = 10, max_body: int = MAX_BODY) -> None:  # fmt: skip
        self.endpoint = endpoint.rstrip("/")
        self.keys = keys
        self.region = region
        self.max_body = max_body
        # total: the whole request, body included (a server that trickles a byte a second is cut off too)
        deadline = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout, sock_connect=connect_timeout)
        self._session = aiohttp.ClientSession(timeout=deadline)

    async def __aenter__(self) -> S3Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def _headers(self, method: str, path: str, query: Mapping[str, str], body: bytes, extra: Mapping[str, str],
                 now: datetime) -> dict[str, str]:  # fmt: skip
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        payload = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256
        headers = {"host": urlsplit(self.endpoint).netloc, "x-amz-date": amz_date, "x-amz-content-sha256": payload}
        headers |= {k.lower(): v for k, v in extra.items()}
        request, signed = canonical_request(method, path, query, headers, payload)
        scope = f"{amz_date[:8]}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(request.encode()).hexdigest()])
        signature = hmac.new(signing_key(self.keys.secret_access_key, amz_date[:8], self.region), to_sign.encode(),
                             hashlib.sha256).hexdigest()  # fmt: skip
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.keys.access_key_id}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={signature}")  # fmt: skip
        return headers

    async def _request(self, operation: str, method: str, bucket: str, query: Mapping[str, str], body: bytes = b"",
                       extra: Mapping[str, str] | None = None, key: str = "") -> bytes:  # fmt: skip
        path = "/" + _encode(bucket, "-_.~") + (f"/{_encode(key, '-_.~/')}" if key else "")
        headers = self._headers(method, path, query, body, extra or {}, datetime.now(UTC))
        encoded_query = "&".join(f"{_encode(k, '-_.~')}={_encode(v, '-_.~')}" for k, v in sorted(query.items()))
        url = URL(f"{self.endpoint}{path}" + (f"?{encoded_query}" if encoded_query else ""), encoded=True)
        try:
            async with self._session.request(method, url, headers=headers, data=body or None,
                                             allow_redirects=False) as response:  # fmt: skip
                content = await self._bounded(operation, bucket, response)
                if response.status >= 300:
                    raise S3Error(f"{operation} on bucket {bucket}: HTTP {response.status} {_error_code(content)}")
                return content
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise S3Error(f"{operation} on bucket {bucket}: {type(exc).__name__}: {exc}") from None

    async def _bounded(self, operation: str, bucket: str, response: aiohttp.ClientResponse) -> bytes:
        """The body, refused once it exceeds ``max_body`` (read in chunks: never more than that in memory)."""
        too_big = S3Error(f"{operation} on bucket {bucket}: the answer exceeds the limit of {self.max_body} bytes")
        if response.content_length is not None and response.content_length > self.max_body:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > self.max_body:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def put(self, bucket: str, key: str, body: bytes) -> None:
        """PutObject (the tests' way to fill a bucket)."""
        await self._request("PutObject", "PUT", bucket, {}, body, key=key)

    async def list_keys(self, bucket: str, prefix: str, page_size: int = 1000, max_pages: int = MAX_PAGES,
                        deadline: float = LIST_DEADLINE) -> list[str]:  # fmt: skip
        """Every key under ``prefix`` (ListObjectsV2, ``page_size`` keys a page). S3Error when the listing would
        take more than ``max_pages`` pages or ``deadline`` seconds (a server may answer "more" forever)."""
        keys: list[str] = []
        token: str | None = None
        try:
            async with asyncio.timeout(deadline):
                for _ in range(max_pages):
                    query = {"list-type": "2", "prefix": prefix, "max-keys": str(page_size)}
                    if token:
                        query["continuation-token"] = token
                    root = _xml("ListObjectsV2", bucket, await self._request("ListObjectsV2", "GET", bucket, query))
                    keys += [key.text or "" for key in root.iter(f"{_NS}Key")]
                    token = root.findtext(f"{_NS}NextContinuationToken")
                    if root.findtext(f"{_NS}IsTruncated") != "true" or not token:
                        return keys
        except TimeoutError:
            raise S3Error(f"ListObjectsV2 on bucket {bucket}: not done within the deadline of {deadline:g}s "
                          f"({len(keys)} keys so far)") from None  # fmt: skip
        raise S3Error(f"ListObjectsV2 on bucket {bucket}: still truncated after the limit of {max_pages} pages "
                      f"({len(keys)} keys so far)")  # fmt: skip

    async def delete_keys(self, bucket: str, keys: Iterable[str]) -> int:
        """Delete ``keys`` (DeleteObjects, 1000 at a time); how many were deleted. Raises S3Error naming the first
        key the server refused."""
        pending = list(keys)
        for start in range(0, len(pending), _BATCH):
            batch = pending[start : start + _BATCH]
            body = delete_body(batch)
            md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
            extra = {"content-md5": md5, "content-type": "application/xml"}
            answer = _xml("DeleteObjects", bucket, await self._request("DeleteObjects", "POST", bucket,
                                                                     {"delete": ""}, body, extra))  # fmt: skip
            error = answer.find(f"{_NS}Error")
            if error is not None:
                raise S3Error(f"DeleteObjects on bucket {bucket}: {error.findtext(f'{_NS}Code')} for "
                              f"{error.findtext(f'{_NS}Key')}")  # fmt: skip
        return len(pending)


def delete_body(keys: list[str]) -> bytes:
    """The DeleteObjects request body (quiet: the answer lists only failures)."""
    root = ElementTree.Element("Delete", xmlns=_NS.strip("{}"))
    ElementTree.SubElement(root, "Quiet").text = "true"
    for key in keys:
        ElementTree.SubElement(ElementTree.SubElement(root, "Object"), "Key").text = key
    body: bytes = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
    return body


def _xml(operation: str, bucket: str, content: bytes) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(content)
    except ElementTree.ParseError as exc:
        raise S3Error(f"{operation} on bucket {bucket}: the answer is not XML ({exc})") from None


def _error_code(content: bytes) -> str:
    try:
        return ElementTree.fromstring(content).findtext("Code") or ""
    except ElementTree.ParseError:
        return ""
