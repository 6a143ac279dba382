"""``python -m kanri.instance [run]`` / ``kanri-instance [run]``: the instance manager, PID 1 of a PostgreSQL pod."""

from __future__ import annotations

import asyncio
import sys

import structlog

from kanri.instance.archive_wal import archive_wal
from kanri.instance.config import Settings, SettingsError
from kanri.instance.exporter import metrics_port
from kanri.instance.isolation import IsolationSettings
from kanri.instance.logs import configure_logging
from kanri.instance.manager import InstanceManager
from kanri.instance.restore import restore_wal

USAGE = (
    "usage: kanri-instance [run]   (configured by environment variables; see docs/instance-manager.md)\n"
    "       kanri-instance archive-wal WAL_PATH   (PostgreSQL's archive_command; see docs/backups.md)\n"
    "       kanri-instance restore-wal recovery|archive WAL_NAME WAL_PATH [SERVER]   (restore_command)\n"
    "       kanri-instance restore-test   (a restore rehearsal's pod; see docs/backups.md)\n"
    "       kanri-instance upgrade-check | upgrade   (a major upgrade's pods; see docs/postgres-operator.md)"
)


def main(argv: list[str] | None = None) -> int:
    """Run the manager until SIGTERM; the exit code is the process's."""
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(args) == 2 and args[0] == "archive-wal":
        return archive_wal(args[1])
    if len(args) in (4, 5) and args[0] == "restore-wal" and args[1] in ("recovery", "archive"):
        server = args[4] if len(args) == 5 else None
        return restore_wal(args[1], args[2], args[3], server=server)  # type: ignore[arg-type]  # checked above
    if args == ["restore-test"]:
        from kanri.instance.rehearsal import main as rehearsal  # only that pod needs it

        return rehearsal()
    if args == ["upgrade-check"]:
        from kanri.instance.upgrade_check import main as upgrade_check

        return upgrade_check()
    if args == ["upgrade"]:
        from kanri.instance.major_upgrade import main as major_upgrade

        return major_upgrade()
    if args not in ([], ["run"]):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env()
        isolation = IsolationSettings.from_env()
        metrics_port()  # checked here, so a bad KANRI_METRICS_PORT is an invalid setting, not a crash later
    except (SettingsError, ValueError) as exc:
        configure_logging()
        structlog.get_logger("kanri.instance").error("invalid settings", reason=str(exc))
        return 2
    configure_logging(instance=settings.name, cluster=settings.cluster, namespace=settings.namespace)
    return asyncio.run(InstanceManager(settings, isolation).run())


if __name__ == "__main__":
    sys.exit(main())
