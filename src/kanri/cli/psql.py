"""``kanri psql CLUSTER [-n NS] [--superuser] [--dbname DB] [-- PSQL ARGS...]``: psql into a PostgresCluster from this
machine in one command (also ``kubectl kanri psql``), instead of the four that fetch the CA and the password, start a
port-forward and run psql with the right connection string.

What it does, in order:

1. reads the PostgresCluster and refuses unless its ``Ready`` condition is True (naming the condition's reason);
2. reads the login from ``<cluster>-app`` (``--superuser``: ``<cluster>-superuser``) and the CA from ``<cluster>-ca``;
3. writes the password into a passfile and the CA into a file, both 0600 in a fresh 0700 directory — the password is
   never in psql's argv nor in its environment (``PGPASSFILE`` names the file; an inherited ``PGPASSWORD`` is dropped,
   as it would win over the passfile);
4. forwards a free local port to the ``-rw`` Service: in-process to its ClusterIP when this machine reaches it (the
   local cluster: each connection is spliced as ``kanri local port-forward`` does, so psql's cancel requests work
   too), otherwise through ``kubectl port-forward`` (any cluster, one pod of the Service);
5. runs psql with ``host=<cluster>-rw.<ns>.svc hostaddr=127.0.0.1 sslmode=verify-full sslrootcert=<CA file>``: libpq
   checks the server certificate against the Service's name, which the operator puts in every server certificate
   (psql from PATH, else the newest PostgreSQL ``make setup`` built for the local cluster);
6. returns psql's exit code, after stopping the forward and removing both files — also when psql was interrupted.
   While psql runs, Ctrl-C is psql's (it cancels the running query); kanri ignores it and waits for psql to end.

The pure parts (:func:`refusal`, :func:`conninfo`, :func:`passfile`, :func:`psql_argv`, :func:`psql_env`) are what
the unit tests check; :func:`session` runs psql through any forward (:func:`direct_forward` to a
:class:`~kanri.local.access.Target`, or kubectl's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from kanri.cli.operations import Context, Kubeconfig, Name, Namespace
from kanri.local.access import Target, forward
from kanri.local.pg_binaries import installed
from kanri.postgres import names
from kanri.postgres.credentials.secrets import secret_value
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime._connection import ConfigError  # not re-exported by kanri.runtime; raised by from_kubeconfig
from kanri.runtime.kinds import SECRET, SERVICE

__all__ = [
    "Login",
    "PsqlError",
    "conninfo",
    "database",
    "direct_forward",
    "find_psql",
    "passfile",
    "psql_argv",
    "psql_command",
    "psql_env",
    "read_login",
    "refusal",
    "session",
]

Obj = dict[str, Any]
POSTGRES_PORT = 5432
PROBE_TIMEOUT = 2.0
"""How long the ClusterIP may take to accept a connection before the forward goes through kubectl instead."""
KUBECTL_TIMEOUT = 30.0
_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+)")
_DROPPED_ENV = ("PGPASSWORD",)
"""Inherited variables that would override the passfile (libpq prefers PGPASSWORD to PGPASSFILE)."""


class PsqlError(Exception):
    """What stops ``kanri psql`` before psql runs; the message says what and what to do."""


@dataclass(frozen=True)
class Login:
    """Who psql logs in as, the password (kept out of reprs) and the CA certificate (PEM) that verifies the server."""

    user: str
    password: str = field(repr=False)
    ca_pem: bytes = field(repr=False)


def refusal(cluster: Obj) -> str | None:
    """Why ``cluster`` cannot be connected to yet (its Ready condition's status, reason and message), or None."""
    name = cluster["metadata"]["name"]
    if cluster["metadata"].get("deletionTimestamp"):
        return f"PostgresCluster {name} is being deleted"
    ready = get_condition((cluster.get("status") or {}).get("conditions"), "Ready")
    if ready is None:
        return f"PostgresCluster {name} is not Ready: the operator has not reported on it yet (is it running?)"
    if ready.get("status") == "True":
        return None
    why = ": ".join(part for part in (ready.get("reason"), ready.get("message")) if part)
    return f"PostgresCluster {name} is not Ready ({why or 'no reason given'})"


def database(cluster: Obj) -> str:
    """The application database the cluster was created with (``bootstrap.initdb.database``, default ``app``)."""
    initdb = ((cluster.get("spec") or {}).get("bootstrap") or {}).get("initdb") or {}
    return str(initdb.get("database") or "app")


def _quote(value: str) -> str:
    """A libpq connection-string value: quoted when empty or holding a space, quote or backslash."""
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def conninfo(cluster: str, namespace: str, port: int, dbname: str, user: str, ca_file: Path) -> str:
    """The connection string psql gets: the ``-rw`` Service's name for certificate verification, the forward's local
    address to connect to. It names the files and the user, never the password."""
    params = {"host": f"{names.read_write_service(cluster)}.{namespace}.svc", "hostaddr": "127.0.0.1",
              "port": str(port), "dbname": dbname, "user": user, "sslmode": "verify-full",
              "sslrootcert": str(ca_file), "connect_timeout": "10"}  # fmt: skip
    return " ".join(f"{key}={_quote(value)}" for key, value in params.items())


def passfile(password: str) -> str:
    """A ``.pgpass`` line matching any host, port, database and user (``:`` and ``\\`` escaped as libpq wants)."""
    return "*:*:*:*:" + password.replace("\\", "\\\\").replace(":", "\\:") + "\n"


def psql_argv(psql: str, connection: str, extra: Sequence[str]) -> list[str]:
    """psql's argv: the connection string as ``--dbname`` (no secret in it), then the user's own arguments."""
    return [psql, f"--dbname={connection}", *extra]


def psql_env(environ: Mapping[str, str], passfile_path: Path) -> dict[str, str]:
    """psql's environment: this one, with ``PGPASSFILE`` naming the passfile and no ``PGPASSWORD``."""
    env = {key: value for key, value in environ.items() if key not in _DROPPED_ENV}
    env["PGPASSFILE"] = str(passfile_path)
    return env


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def _login_files(login: Login) -> Iterator[tuple[Path, Path]]:
    """The passfile and the CA file in a fresh 0700 directory, removed on the way out whatever happened."""
    folder = Path(tempfile.mkdtemp(prefix="kanri-psql-"))
    try:
        _write_private(folder / "pgpass", passfile(login.password).encode())
        _write_private(folder / "ca.crt", login.ca_pem)
        yield folder / "pgpass", folder / "ca.crt"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _run_psql(argv: list[str], env: dict[str, str]) -> int:
    """Run psql on this terminal until it exits. SIGINT is psql's own business meanwhile (it cancels the query); a
    SIGTERM to kanri is passed on."""
    proc = await asyncio.create_subprocess_exec(*argv, env=env)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    loop.add_signal_handler(signal.SIGTERM, lambda: _terminate(proc))
    try:
        code = await proc.wait()
        return 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + N
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        if proc.returncode is None:  # cancelled while psql still runs
            proc.terminate()
            await proc.wait()


def _terminate(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()


@contextlib.asynccontextmanager
async def direct_forward(target: Target) -> AsyncIterator[int]:
    """A forward from a free port of 127.0.0.1 to ``target``, served by this process; yields the port."""
    server = await forward(target, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


async def session(cluster: str, namespace: str, dbname: str, login: Login, forwarded: AbstractAsyncContextManager[int],
                  psql: str, extra: Sequence[str], environ: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """psql through ``forwarded`` (a context yielding the local port); psql's exit code. The login files and the
    forward are gone when this returns or raises."""
    with _login_files(login) as (pgpass, ca_file):
        async with forwarded as port:
            argv = psql_argv(psql, conninfo(cluster, namespace, port, dbname, login.user, ca_file), extra)
            return await _run_psql(argv, psql_env(os.environ if environ is None else environ, pgpass))


def _kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"  # the venv's kubectl, as `make setup` installs it
    found = shutil.which("kubectl") or (str(beside) if beside.exists() else None)
    if found is None:
        raise PsqlError(
            "this machine cannot reach the cluster's Service addresses and kubectl (for a port-forward) is not "
            "installed; install kubectl, or run kanri psql where the ClusterIPs are reachable"
        )
    return found


@contextlib.asynccontextmanager
async def _kubectl_forward(service: str, namespace: str, kubeconfig: Path | None,
                           context: str | None) -> AsyncIterator[int]:  # fmt: skip
    """``kubectl port-forward svc/<service> :5432`` in its own session (the terminal's Ctrl-C is psql's, not its);
    yields the local port it chose, stops it on the way out."""
    argv = [_kubectl(), "port-forward", f"svc/{service}", f":{POSTGRES_PORT}", "-n", namespace,
            "--address", "127.0.0.1"]  # fmt: skip
    argv += [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    argv += [f"--context={context}"] if context else []
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)  # fmt: skip
    drains: list[asyncio.Task[None]] = []
    try:
        port = await _forwarded_port(proc, service)
        # its "Handling connection" lines and per-connection errors: read on, so a full pipe never stalls kubectl
        drains = [asyncio.create_task(_drain(stream)) for stream in (proc.stdout, proc.stderr) if stream]
        yield port
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        for drain in drains:
            drain.cancel()


async def _forwarded_port(proc: asyncio.subprocess.Process, service: str) -> int:
    """The local port kubectl reports it forwards from; PsqlError with kubectl's words when it gives up."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(KUBECTL_TIMEOUT):
            while line := await proc.stdout.readline():
                if match := _FORWARDING.search(line):
                    return int(match.group(1))
            why = (await proc.stderr.read()).decode(errors="replace").strip()
    except TimeoutError:
        why = f"no forward within {KUBECTL_TIMEOUT:.0f} s"
    raise PsqlError(f"kubectl port-forward to svc/{service} failed: {why or 'it exited without a word'}")


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def _reachable(target: Target) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), PROBE_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def find_psql() -> str:
    """psql on PATH, else the newest PostgreSQL ``make setup`` built for the local cluster (``.build/postgres``,
    :mod:`kanri.local.pg_binaries`; its psql finds its own libpq by rpath)."""
    if found := shutil.which("psql"):
        return found
    try:
        builds = installed()
    except FileNotFoundError:  # an installed kanri, no source checkout: no local builds
        builds = []
    for build in reversed(builds):
        if (build.bin_dir / "psql").is_file():
            return str(build.bin_dir / "psql")
    raise PsqlError("psql is not installed (Debian and Ubuntu: apt-get install postgresql-client)")


async def _read(client: Client, kind: Any, name: str, namespace: str, what: str) -> Obj:
    try:
        return await client.get(kind, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            raise PsqlError(f"{what} {namespace}/{name} not found") from None
        raise


async def read_login(client: Client, cluster: str, namespace: str, superuser: bool) -> Login:
    """The login from ``<cluster>-app`` (or ``<cluster>-superuser``) and the CA from ``<cluster>-ca``."""
    secret = names.superuser_secret(cluster) if superuser else names.app_secret(cluster)
    credentials = await _read(client, SECRET, secret, namespace, "the login Secret")
    user, password = secret_value(credentials, "username"), secret_value(credentials, "password")
    if not user or not password:
        raise PsqlError(f"Secret {namespace}/{secret} has no username or no password key")
    ca_secret = names.ca_secret(cluster)
    ca_pem = secret_value(await _read(client, SECRET, ca_secret, namespace, "the CA Secret"), "ca.crt")
    if not ca_pem:
        raise PsqlError(f"Secret {namespace}/{ca_secret} has no ca.crt key (the operator publishes it with the "
                        "server certificate; see docs/security.md)")  # fmt: skip
    return Login(user, password, ca_pem.encode())


async def _prepare(client: Client, name: str, namespace: str, superuser: bool) -> tuple[Obj, Login, Target]:
    """The cluster (Ready, or PsqlError saying why not), the login, and where its ``-rw`` Service listens."""
    cluster = await _read(client, POSTGRES_CLUSTER, name, namespace, "PostgresCluster")
    if why := refusal(cluster):
        raise PsqlError(why)
    login = await read_login(client, name, namespace, superuser)
    rw = names.read_write_service(name)
    ip = ((await _read(client, SERVICE, rw, namespace, "the Service")).get("spec") or {}).get("clusterIP")
    if not ip or ip == "None":
        raise PsqlError(f"Service {namespace}/{rw} has no ClusterIP")
    return cluster, login, Target(ip, POSTGRES_PORT, f"svc/{rw} ({ip}:{POSTGRES_PORT})")


async def _psql(name: str, namespace: str, superuser: bool, dbname: str | None, extra: Sequence[str],
                kubeconfig: Path | None, context: str | None) -> int:  # fmt: skip
    psql = find_psql()
    async with await Client.from_kubeconfig(str(kubeconfig) if kubeconfig else None, context) as client:
        cluster, login, target = await _prepare(client, name, namespace, superuser)
    # the API connection is closed before psql starts: a long session holds only the forward
    if await _reachable(target):
        forwarded = direct_forward(target)
    else:
        forwarded = _kubectl_forward(names.read_write_service(name), namespace, kubeconfig, context)
    return await session(name, namespace, dbname or database(cluster), login, forwarded, psql, extra)


def psql_command(
    name: Name,
    args: Annotated[
        list[str] | None, typer.Argument(help="psql's own arguments, after --: kanri psql NAME -- -c 'select 1'")
    ] = None,
    namespace: Namespace = "default",
    superuser: Annotated[
        bool, typer.Option("--superuser", help="Log in as postgres (<cluster>-superuser), not the app user.")
    ] = False,
    dbname: Annotated[
        str | None, typer.Option("--dbname", "-d", help="Database (default: the cluster's bootstrap database).")
    ] = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Open psql on the cluster's primary as the app user (or --superuser), TLS verified against the cluster's CA,
    through a port-forward kanri manages; exits with psql's exit code."""
    try:
        code = asyncio.run(_psql(name, namespace, superuser, dbname, args or [], kubeconfig, context))
    except (PsqlError, ApiError, ConfigError) as exc:
        typer.echo(f"kanri psql: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:  # before psql started: the files and the forward are already gone
        raise typer.Exit(130) from None
    raise typer.Exit(code)
