"""``python -m kanri.postgres.pooler.agent <pgbouncer.ini>``: PgBouncer as a child, its metrics on
``KANRI_POOLER_METRICS_PORT`` (default 9127; 0 turns them off), SIGTERM and SIGINT passed on; exits with PgBouncer's
exit code. With ``KANRI_POOLER_PRIMARY_CHECK`` (``rw`` poolers) it also follows the primary behind the Service and
has PgBouncer renew its server connections when it changed (:mod:`kanri.postgres.pooler.agent.primary_watch`), then
end those left in use on the old primary (:mod:`kanri.postgres.pooler.agent.stranded`).
``KANRI_PGBOUNCER`` names the binary (default ``/usr/sbin/pgbouncer``). The contract with the operator's Deployment
(kanri.postgres.pooler.children) is the argument, the environment and the mounts below."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry, start_http_server

from kanri.postgres.pooler.agent import primary_watch, stranded
from kanri.postgres.pooler.agent.metrics import PoolerCollector, console_reader

AUTH_FILE = Path("/etc/pgbouncer/auth/userlist.txt")
CA_FILE = Path("/etc/pgbouncer/tls/ca.crt")


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m kanri.postgres.pooler.agent <pgbouncer.ini>", file=sys.stderr)
        return 2
    binary = os.environ.get("KANRI_PGBOUNCER", "/usr/sbin/pgbouncer")
    child = subprocess.Popen([binary, sys.argv[1]])

    stopping: list[int] = []

    def forward(signum: int, _: FrameType | None) -> None:
        stopping.append(signum)
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    port = int(os.environ.get("KANRI_POOLER_METRICS_PORT", "9127"))
    if port:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(PoolerCollector(console_reader(5432, AUTH_FILE, CA_FILE)))
        registry.register(primary_watch.RENEWALS)
        registry.register(primary_watch.ENDED)
        start_http_server(port, registry=registry)
    if conninfo := os.environ.get(primary_watch.PRIMARY_CHECK_ENV):
        free = stranded.freer(5432, AUTH_FILE, CA_FILE, stranded.StrandedServers())
        follow = primary_watch.watch(primary_watch.checker(conninfo, AUTH_FILE, CA_FILE),
                                     primary_watch.renewer(5432, AUTH_FILE, CA_FILE), free=free)  # fmt: skip
        threading.Thread(target=asyncio.run, args=(follow,), name="primary-watch", daemon=True).start()
    code = child.wait()
    return 0 if stopping else code  # PgBouncer's "fast exit" on SIGTERM is status 1: asked for, not a failure


if __name__ == "__main__":
    sys.exit(main())
