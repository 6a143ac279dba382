"""Where the API server is and how to talk to it: kubeconfig and in-cluster configuration, read once.

kubernetes_asyncio's loader imports its generated models (about 40 MiB and a third of a second), and its session has
``trust_env=True``, which makes aiohttp look up netrc and proxy settings in a thread for every request. The common
configurations (a server with a CA, client certificates, a token, a token file, basic auth; a pod's service account)
are read here instead; only exec plugins and auth providers fall back to kubernetes_asyncio, imported on demand.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import yaml

Obj = dict[str, Any]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TOKEN_RELOAD = 60.0  # the kubelet rotates projected tokens well before they expire; client-go re-reads each minute


class ConfigError(Exception):
    """No usable configuration: not in a pod, no kubeconfig, or a kubeconfig naming what it does not hold."""


class Credentials(Protocol):
    """Supplies the ``Authorization`` header of each request (None: none, e.g. client certificates only)."""

    async def authorization(self) -> str | None: ...


@dataclass(frozen=True)
class Static:
    """A header that never changes: a kubeconfig's token or basic-auth pair, or none at all."""

    header: str | None = None

    async def authorization(self) -> str | None:
        return self.header


@dataclass
class TokenFile:
    """A bearer token read from a file and re-read every minute (service-account tokens are rotated)."""

    path: Path
    reload_after: float = _TOKEN_RELOAD
    clock: Callable[[], float] = time.monotonic
    _token: str = field(default="", init=False)
    _read_at: float = field(default=float("-inf"), init=False)

    async def authorization(self) -> str | None:
        now = self.clock()
        if now - self._read_at >= self.reload_after:
            try:
                self._token = self.path.read_text().strip()
            except OSError:
                if not self._token:  # keep the last good token through a rotation's brief gap
                    raise
            self._read_at = now
        return f"Bearer {self._token}" if self._token else None


@dataclass
class Fallback:
    """kubernetes_asyncio's own refresh logic (exec plugins, auth providers), asked before every request."""

    auth_settings: Callable[[], Awaitable[dict[str, dict[str, Any]]]]

    async def authorization(self) -> str | None:
        token = (await self.auth_settings()).get("BearerToken")
        return str(token["value"]) if token and token.get("value") else None


@dataclass
class Connection:
    """Everything the Client's session needs, resolved once: the server, TLS, the proxy and the credentials."""

    host: str
    ssl_context: ssl.SSLContext | None = None
    """None for plain http."""
    server_hostname: str | None = None
    """TLS server name to verify when it differs from the host (kubeconfig ``tls-server-name``)."""
    proxy: str | None = None
    credentials: Credentials = field(default_factory=Static)


def proxy_for(host: str, explicit: str | None = None) -> str | None:
    """The proxy for ``host``: the kubeconfig's ``proxy-url``, else ``HTTPS_PROXY``/``HTTP_PROXY`` unless
    ``NO_PROXY`` covers the host — looked up once, not per request as aiohttp's ``trust_env`` does."""
    if explicit:
        return explicit
    parts = urlsplit(host)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme or "https")
    if not proxy or not parts.hostname:
        return None
    return None if urllib.request.proxy_bypass(parts.netloc) else proxy


def in_cluster(root: Path = SERVICE_ACCOUNT, environ: dict[str, str] | None = None) -> Connection:
    """The pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``, its CA and its (rotating) token."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token, ca = root / "token", root / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        raise ConfigError("not running in a pod (no service host, token or CA)")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    server = f"https://{host}:{port}"
    return Connection(
        server, ssl.create_default_context(cafile=str(ca)), proxy=proxy_for(server), credentials=TokenFile(token)
    )


def _kubeconfig_paths(path: str | None) -> list[Path]:
    if path is not None:
        return [Path(path).expanduser()]
    value = os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p]


@dataclass
class _Merged:
    """kubeconfig files merged the way kubectl does: the first file to name a context, cluster or user wins."""

    current_context: str | None = None
    named: dict[str, dict[str, tuple[Obj, Path]]] = field(
        default_factory=lambda: {"contexts": {}, "clusters": {}, "users": {}}
    )

    def add(self, doc: Obj, path: Path) -> None:
        self.current_context = self.current_context or doc.get("current-context")
        for section, entries in self.named.items():
            for entry in doc.get(section) or ():
                name = entry.get("name")
                key = section[:-1]  # "contexts" -> "context"
                if name is not None and name not in entries:
                    entries[name] = (entry.get(key) or {}, path.parent)

    def entry(self, section: str, name: str) -> tuple[Obj, Path]:
        try:
            return self.named[section][name]
        except KeyError:
            raise ConfigError(f"kubeconfig has no {section[:-1]} named {name!r}") from None


def _file_or_data(entry: Obj, key: str, base: Path, cleanup: list[Path]) -> str | None:
    """A path to ``key`` (relative to the kubeconfig's folder) or to ``key-data`` written to a private temp file
    (OpenSSL loads certificates from files only; the caller removes it once loaded)."""
    if data := entry.get(f"{key}-data"):
        try:
            raw = base64.standard_b64decode(data)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"{key}-data is not base64") from exc
        fd, name = tempfile.mkstemp(prefix="kanri-", suffix=".pem")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        cleanup.append(Path(name))
        return name
    if value := entry.get(key):
        return str(base / Path(value).expanduser())
    return None


def load_kubeconfig(path: str | None = None, context: str | None = None) -> Connection | None:
    """The connection a kubeconfig describes, or None when its user needs kubernetes_asyncio (exec, auth-provider)."""
    merged = _Merged()
    for candidate in _kubeconfig_paths(path):
        if candidate.is_file():
            with candidate.open() as f:
                doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if isinstance(doc, dict):
                merged.add(doc, candidate)
    name = context or merged.current_context
    if not name:
        raise ConfigError(f"no kubeconfig context (looked in {', '.join(map(str, _kubeconfig_paths(path)))})")
    ctx, _ = merged.entry("contexts", name)
    cluster, cluster_base = merged.entry("clusters", str(ctx.get("cluster")))
    user, user_base = merged.entry("users", str(ctx["user"])) if ctx.get("user") else ({}, Path())
    if "exec" in user or "auth-provider" in user:
        return None
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f"cluster {ctx.get('cluster')!r} has no server")
    cleanup: list[Path] = []
    connection = Connection(server, proxy=proxy_for(server, cluster.get("proxy-url")))
    try:
        if server.startswith("https"):
            connection.ssl_context = _tls(
                ca=_file_or_data(cluster, "certificate-authority", cluster_base, cleanup),
                cert=_file_or_data(user, "client-certificate", user_base, cleanup),
                key=_file_or_data(user, "client-key", user_base, cleanup),
                verify=not cluster.get("insecure-skip-tls-verify", False),
            )
            connection.server_hostname = cluster.get("tls-server-name") or None
        if token := user.get("token"):
            connection.credentials = Static(f"Bearer {token}")
        elif token_file := user.get("tokenFile"):
            connection.credentials = TokenFile(user_base / Path(token_file).expanduser())
        elif "username" in user and "password" in user:
            pair = f"{user['username']}:{user['password']}".encode()
            connection.credentials = Static("Basic " + base64.standard_b64encode(pair).decode())
    finally:
        for temporary in cleanup:  # loaded into the SSL context: no key material left on disk
            temporary.unlink(missing_ok=True)
    return connection


def _tls(*, ca: str | None, cert: str | None, key: str | None, verify: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, keyfile=key)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def load_with_kubernetes_asyncio(path: str | None, context: str | None) -> Connection:
    """Exec plugins and auth providers: kubernetes_asyncio's loader, imported only now (it costs ~40 MiB)."""
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    configuration = k8s_client.Configuration()
    await k8s_config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    host = str(configuration.host).rstrip("/")
    credentials = Fallback(configuration.auth_settings)
    connection = Connection(host, proxy=proxy_for(host, configuration.proxy), credentials=credentials)
    if host.startswith("https"):
        connection.ssl_context = _tls(
            ca=configuration.ssl_ca_cert, cert=configuration.cert_file, key=configuration.key_file,
            verify=bool(configuration.verify_ssl),
        )  # fmt: skip
        connection.server_hostname = configuration.tls_server_name or None
    return connection
