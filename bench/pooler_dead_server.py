"""How long a pooled client waits when PgBouncer's server is cut off (packets dropped), with the operator's TCP
settings (``tcp_*`` of kanri.postgres.pooler.config.DEFAULTS) and with PgBouncer's and Linux's defaults.

    sudo .venv/bin/python bench/pooler_dead_server.py [--give-up 120]

Runs itself again under ``unshare --net``: a private network namespace with only its loopback, so the nftables
rule that drops the server's traffic touches nothing else on the machine and goes with the namespace. In it: a
PostgreSQL 15 (Debian's, trust on 127.0.0.1) and PgBouncer 1.18 (transaction mode, ``auth_type = trust``: only the
TCP settings differ between runs), a client in a transaction; then every packet to and from PostgreSQL's port is
dropped, either before the client's next statement (PgBouncer's write goes unacknowledged: ``tcp_user_timeout``) or
while a statement runs (PgBouncer waits in silence: keepalive, bounded by ``tcp_user_timeout``). Prints the seconds
from the cut to the client's error, or that it still waited after ``--give-up``. Numbers: docs/pooler.md.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import psycopg

from kanri.postgres.pooler.config import DEFAULTS

PG_BIN = Path(os.environ.get("KANRI_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PGBOUNCER = "/usr/sbin/pgbouncer"
INNER = "KANRI_BENCH_PRIVATE_NET"
CUT = (
    "table inet cut {\n chain out { type filter hook output priority 0; "
    "tcp dport 6543 drop; tcp sport 6543 drop; }\n}\n"
)
"""Every packet to and from PostgreSQL's port dropped (on the namespace's loopback, output sees both directions)."""


class GaveUp(Exception):
    pass


def _give_up(_signum: int, _frame: FrameType | None) -> None:
    raise GaveUp


def _as_postgres(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True)


def case(root: Path, tcp: dict[str, str], during: bool, give_up: int) -> str:
    """One run: the seconds from the cut to the client's error, or that it still waited."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o1777)
    root.chmod(0o1777)
    pg = pwd.getpwnam("postgres")
    os.chown(root, pg.pw_uid, pg.pw_gid)
    _as_postgres(str(PG_BIN / "initdb"), "-D", f"{root}/data", "-A", "trust", "-U", "postgres")
    _as_postgres(str(PG_BIN / "pg_ctl"), "-D", f"{root}/data", "-l", f"{root}/pg.log", "-w", "start",
                 "-o", f"-p 6543 -k {root} -c listen_addresses=127.0.0.1")  # fmt: skip
    (root / "users.txt").write_text('"postgres" ""\n')
    settings = "".join(f"{k} = {v}\n" for k, v in tcp.items())
    (root / "pgbouncer.ini").write_text(
        "[databases]\ndb = host=127.0.0.1 port=6543 dbname=postgres user=postgres\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = 6432\nunix_socket_dir =\nauth_type = trust\n"
        f"auth_file = {root}/users.txt\npool_mode = transaction\nlogfile = {root}/pgbouncer.log\n{settings}"
    )
    for path in root.iterdir():
        if path.is_file():
            path.chmod(0o644)
    bouncer = subprocess.Popen(
        [PGBOUNCER, "-u", "nobody", str(root / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )  # its log: the logfile
    cut_at = [0.0]

    def cut() -> None:
        subprocess.run(["nft", "-f", "-"], input=CUT.encode(), check=True)
        cut_at[0] = time.monotonic()

    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client = psycopg.connect("host=127.0.0.1 port=6432 dbname=db user=postgres connect_timeout=2")
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        client.execute("SELECT 1")  # in a transaction: the server connection is the client's
        if during:
            threading.Timer(1.0, cut).start()
            statement = "SELECT pg_sleep(20)"
        else:
            cut()
            statement = "SELECT 2"
        signal.signal(signal.SIGALRM, _give_up)
        signal.alarm(give_up)
        try:
            client.execute(statement)
            return "answered (not expected)"
        except GaveUp:
            return f"still waiting after {time.monotonic() - cut_at[0]:.1f} s (gave up)"
        except psycopg.Error as exc:
            return f"error after {time.monotonic() - cut_at[0]:.1f} s ({str(exc).strip().splitlines()[0]})"
        finally:
            signal.alarm(0)
    finally:
        subprocess.run(["nft", "delete", "table", "inet", "cut"], capture_output=True)
        bouncer.terminate()
        bouncer.wait()
        subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", f"{root}/data",
                        "-m", "immediate", "stop"], capture_output=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--give-up", type=int, default=120, help="seconds a client may wait before the run gives up")
    args = parser.parse_args()
    if os.environ.get(INNER) != "1":
        env = {**os.environ, INNER: "1"}
        return subprocess.run(["unshare", "--net", sys.executable, *sys.argv], env=env).returncode
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    ours = {k: v for k, v in DEFAULTS.items() if k.startswith("tcp_")}
    work = Path(tempfile.mkdtemp(prefix="kanri-bench-dead-server-"))
    work.chmod(0o755)
    try:
        for name, tcp in (("operator's tcp_* settings", ours), ("PgBouncer's and Linux's defaults", {})):
            for during in (False, True):
                when = "while a statement runs" if during else "before the next statement"
                result = case(work / f"{len(tcp)}-{during}", tcp, during, args.give_up)
                print(f"{name}, server cut off {when}: {result}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
