"""The AWS IAM calls the operator makes to give each namespace its own object-store identity: create a user, put its
inline policy, list / create / delete its access keys — the IAM Query API (``Action=...&Version=2010-05-08``, signed
with SigV4 for service ``iam``) over the aiohttp the operator already has.

Spoken by AWS IAM itself and by SeaweedFS's IAM API (embedded in its S3 port since 4.03; writes need
``-s3.iam.readOnly=false``). Why not boto3: see :mod:`kanri.postgres.backup.s3` (its pins clash with the lock); the
signing
is shared with that module. Every request has a deadline and its answer a size limit. Secrets never appear in a URL,
a log or an exception: the secret of a new access key is returned to the caller only.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import aiohttp

from kanri.postgres.backup.s3 import S3Keys, canonical_request, signing_key

__all__ = ["IamClient", "IamError", "NewAccessKey"]

_NS = "{https://iam.amazonaws.com/doc/2010-05-08/}"
_VERSION = "2010-05-08"
_MAX_BODY = 1024 * 1024
"""An IAM answer is a few KiB; more is refused rather than read into memory."""


class IamError(Exception):
    """A request the server refused (``code`` is IAM's error code, e.g. ``EntityAlreadyExists``) or that could not be
    made (``code`` empty); the message names the action, never a secret."""

    def __init__(self, action: str, code: str, detail: str) -> None:
        super().__init__(f"IAM {action}: {code or 'request failed'}: {detail}"[:500])
        self.action = action
        self.code = code


@dataclass(frozen=True)
class NewAccessKey:
    """An access key just made: the only moment IAM tells its secret."""

    access_key_id: str
    secret_access_key: str = field(repr=False)


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


class IamClient:
    """IAM Query API calls signed with ``keys``; use as ``async with IamClient(...) as iam``."""

    def __init__(self, endpoint: str, keys: S3Keys, region: str = "us-east-1", timeout: float = 15) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.keys = keys
        self.region = region
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 5)))

    async def __aenter__(self) -> IamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def _signed(self, body: bytes, now: datetime) -> dict[str, str]:
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        payload = hashlib.sha256(body).hexdigest()
        headers = {
            "host": urlsplit(self.endpoint).netloc,
            "content-type": "application/x-www-form-urlencoded; charset=utf-8",
            "x-amz-date": amz_date,
        }
        request, signed = canonical_request("POST", "/", {}, headers, payload)
        scope = f"{amz_date[:8]}/{self.region}/iam/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(request.encode()).hexdigest()])
        key = signing_key(self.keys.secret_access_key, amz_date[:8], self.region, "iam")
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.keys.access_key_id}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={signature}")  # fmt: skip
        return headers

    async def _call(self, action: str, params: dict[str, str]) -> ElementTree.Element:
        body = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in sorted(({"Action": action, "Version": _VERSION}
                                                                           | params).items())).encode()  # fmt: skip
        try:
            async with self._session.post(self.endpoint + "/", data=body, headers=self._signed(body, datetime.now(UTC)),
                                          allow_redirects=False) as response:  # fmt: skip
                content = await response.content.read(_MAX_BODY + 1)
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise IamError(action, "", f"{type(exc).__name__}: {exc}") from None
        if len(content) > _MAX_BODY:
            raise IamError(action, "", f"answer larger than {_MAX_BODY} bytes")
        try:
            root = ElementTree.fromstring(content)
        except ElementTree.ParseError:
            raise IamError(action, "", f"HTTP {status}, not an IAM answer") from None
        if status >= 300:
            code = root.findtext(f".//{_NS}Code") or root.findtext(".//Code") or f"HTTP{status}"
            message = root.findtext(f".//{_NS}Message") or root.findtext(".//Message") or ""
            raise IamError(action, code, message)
        return root

    async def create_user(self, user: str) -> bool:
        """Create ``user``; False when it already existed."""
        try:
            await self._call("CreateUser", {"UserName": user})
        except IamError as exc:
            if exc.code == "EntityAlreadyExists":
                return False
            raise
        return True

    async def put_user_policy(self, user: str, name: str, document: str) -> None:
        """Set (create or replace) the inline policy ``name`` of ``user``."""
        await self._call("PutUserPolicy", {"UserName": user, "PolicyName": name, "PolicyDocument": document})

    async def list_access_keys(self, user: str) -> list[str]:
        """The ids of ``user``'s access keys."""
        root = await self._call("ListAccessKeys", {"UserName": user})
        return [k.text or "" for k in root.iter(f"{_NS}AccessKeyId")]

    async def create_access_key(self, user: str) -> NewAccessKey:
        root = await self._call("CreateAccessKey", {"UserName": user})
        key_id, secret = root.findtext(f".//{_NS}AccessKeyId"), root.findtext(f".//{_NS}SecretAccessKey")
        if not key_id or not secret:
            raise IamError("CreateAccessKey", "", "the answer holds no access key")
        return NewAccessKey(key_id, secret)

    async def delete_access_key(self, user: str, key_id: str) -> None:
        await self._call("DeleteAccessKey", {"UserName": user, "AccessKeyId": key_id})
