"""kanri reads kubeconfig and in-cluster configuration itself (kubernetes_asyncio only for exec plugins and auth
providers): what a kubeconfig says is what the connection does."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kanri.runtime._connection import (
    ConfigError,
    TokenFile,
    in_cluster,
    load_kubeconfig,
    proxy_for,
)


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None, name: str = "k") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster or {"server": "http://127.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_a_token_becomes_a_bearer_header_and_the_server_loses_its_trailing_slash(tmp_path: Path) -> None:
    connection = load_kubeconfig(str(kubeconfig(tmp_path, {"token": "abc"})))
    assert connection is not None
    assert connection.host == "http://127.0.0.1:6443"
    assert await connection.credentials.authorization() == "Bearer abc"
    assert connection.ssl_context is None


async def test_a_token_file_is_relative_to_the_kubeconfig_and_read_again_after_a_minute(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("one\n")
    connection = load_kubeconfig(str(kubeconfig(tmp_path, {"tokenFile": "token"})))
    assert connection is not None
    credentials = connection.credentials
    assert isinstance(credentials, TokenFile)
    now = [100.0]
    credentials.clock = lambda: now[0]
    assert await credentials.authorization() == "Bearer one"
    (tmp_path / "token").write_text("two")
    now[0] += 30
    assert await credentials.authorization() == "Bearer one"
    now[0] += 31
    assert await credentials.authorization() == "Bearer two"


async def test_basic_auth(tmp_path: Path) -> None:
    connection = load_kubeconfig(str(kubeconfig(tmp_path, {"username": "ann", "password": "s3cret"})))
    assert connection is not None
    expected = "Basic " + base64.b64encode(b"ann:s3cret").decode()
    assert await connection.credentials.authorization() == expected


def test_exec_plugins_and_auth_providers_are_left_to_kubernetes_asyncio(tmp_path: Path) -> None:
    assert load_kubeconfig(str(kubeconfig(tmp_path, {"exec": {"command": "get-token"}}))) is None
    assert load_kubeconfig(str(kubeconfig(tmp_path, {"auth-provider": {"name": "oidc"}}, name="k2"))) is None


def test_an_unknown_context_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no context named 'other'"):
        load_kubeconfig(str(kubeconfig(tmp_path, {"token": "x"})), context="other")


def test_merged_kubeconfigs_take_the_first_entry_of_each_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path, {"token": "first"}, name="a")
    second = kubeconfig(tmp_path, {"token": "second"}, {"server": "http://elsewhere:1"}, name="b")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    connection = load_kubeconfig()
    assert connection is not None
    assert connection.host == "http://127.0.0.1:6443"


def make_pki(tmp_path: Path) -> tuple[bytes, bytes]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=kanri-test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert.read_bytes(), key.read_bytes()


def test_certificate_data_is_loaded_and_no_key_material_is_left_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = make_pki(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    user = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    cluster = {"server": "https://127.0.0.1:6443", "certificate-authority-data": b64(cert), "tls-server-name": "api"}
    connection = load_kubeconfig(str(kubeconfig(tmp_path, user, cluster)))
    assert connection is not None
    assert connection.ssl_context is not None
    assert connection.server_hostname == "api"
    assert connection.ssl_context.get_ca_certs()[0]["subject"] == ((("commonName", "kanri-test"),),)
    assert list(scratch.iterdir()) == []


def test_insecure_skip_tls_verify_turns_verification_off(tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}
    connection = load_kubeconfig(str(kubeconfig(tmp_path, {"token": "x"}, cluster)))
    assert connection is not None
    assert connection.ssl_context is not None
    assert not connection.ssl_context.check_hostname


def test_the_proxy_is_the_kubeconfigs_else_the_environments_unless_no_proxy_covers_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example,10.0.0.1")
    assert proxy_for("https://api.example:6443") == "http://proxy:3128"
    assert proxy_for("https://api.internal.example:6443") is None
    assert proxy_for("https://10.0.0.1:6443") is None
    assert proxy_for("https://api.example:6443", "http://mine:8080") == "http://mine:8080"


async def test_in_cluster_uses_the_service_host_and_the_rotating_token(tmp_path: Path) -> None:
    cert, _ = make_pki(tmp_path)
    (tmp_path / "ca.crt").write_bytes(cert)
    (tmp_path / "token").write_text("sa-token")
    connection = in_cluster(tmp_path, {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert connection.host == "https://[fd00::1]:443"
    assert await connection.credentials.authorization() == "Bearer sa-token"
    with pytest.raises(ConfigError):
        in_cluster(tmp_path, {})


def test_importing_the_runtime_does_not_import_kubernetes_asyncio() -> None:
    code = "import sys, kanri.runtime; print(any(m.startswith('kubernetes_asyncio') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
