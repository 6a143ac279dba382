"""After a major upgrade, on the new primary: ``update_extensions.sql`` and the optimizer statistics.

pg_upgrade carries no planner statistics before PostgreSQL 18 (and not all of them in 18), and may write
``update_extensions.sql`` for extensions whose new version needs ``ALTER EXTENSION ... UPDATE``. The upgrade pod
leaves ``<volume>/kanri-upgrade/post-upgrade.json`` (:mod:`kanri.instance.major_upgrade`); the instance manager runs
:func:`run` once its server is a primary accepting connections, in the background (``vacuumdb --analyze-in-stages``
gives usable statistics within seconds and complete ones later; the cluster serves meanwhile). The marker is renamed
``post-upgrade.done.json`` with the outcome, so it runs once, and again after a restart only if it did not finish.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

from kanri.instance.config import Settings
from kanri.instance.major_upgrade import POST_UPGRADE, WORK_DIR
from kanri.instance.upgrade_tools import run_tool

__all__ = ["marker", "pending", "run"]

log = structlog.get_logger("kanri.instance.post_upgrade")


def marker(settings: Settings) -> Path:
    return settings.pgdata.parent / WORK_DIR / POST_UPGRADE


def pending(settings: Settings) -> bool:
    return marker(settings).is_file()


def _exists(path: str) -> bool:
    return Path(path).is_file()


async def run(settings: Settings, major: int | None) -> dict[str, object]:
    """The steps of the module docstring, on the local socket as the superuser; returns (and records) the outcome."""
    path = marker(settings)
    try:
        asked = json.loads(path.read_text())
    except (OSError, ValueError):
        asked = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    socket = ["-h", str(settings.socket_dir), "-p", str(settings.pg_port), "-U", "postgres"]
    outcome: dict[str, object] = {}
    script = asked.get("updateExtensions")
    if isinstance(script, str) and _exists(script):
        code, text = await run_tool([settings.binary("psql"), "-X", *socket, "-d", "postgres",
                                     "-v", "ON_ERROR_STOP=1", "-f", script], env=env)  # fmt: skip
        outcome["updateExtensions"] = "done" if code == 0 else f"failed: {text.strip()[-300:]}"
        log.info("update_extensions.sql", outcome=outcome["updateExtensions"])
    if asked.get("analyze", True):
        args = [settings.binary("vacuumdb"), *socket, "--all", "--analyze-in-stages"]
        if major is not None and major >= 18:
            args.append("--missing-stats-only")  # 18 carries most statistics over
        code, text = await run_tool(args, env=env)
        outcome["analyze"] = "done" if code == 0 else f"failed: {text.strip()[-300:]}"
        log.info("statistics rebuilt after the major upgrade", outcome=outcome["analyze"])
    done = path.with_name("post-upgrade.done.json")
    done.write_text(json.dumps({**asked, **outcome}))
    path.unlink(missing_ok=True)
    return outcome
