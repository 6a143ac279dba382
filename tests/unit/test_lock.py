"""requirements/lock.txt and runtime.lock.txt (made by `make lock`) pin, with hashes, every dependency pyproject.toml
pins, at the same versions: `make setup` installs from them with --require-hashes, so a pin missing there would fail
the install and a differing version would silently win over pyproject's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
FIX = "run `make lock` and commit requirements/"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def locked(path: Path) -> dict[str, tuple[str, int]]:
    """Each locked distribution: its version and how many hashes it carries."""
    entries: dict[str, tuple[str, int]] = {}
    current = ""
    for line in path.read_text().splitlines():
        if match := _ENTRY.match(line):
            current = canonicalize_name(match[1])
            entries[current] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = entries[current]
            entries[current] = (version, hashes + 1)
    return entries


def pins(requirements: list[str]) -> dict[str, str]:
    """name → version of ``name==version`` requirements (extras add their own distributions, locked separately)."""
    found: dict[str, str] = {}
    for text in requirements:
        requirement = Requirement(text)
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"pyproject.toml must pin exactly: {text}"
        found[canonicalize_name(requirement.name)] = spec.version
    return found


RUNTIME = pins(PYPROJECT["project"]["dependencies"])
DEV = pins(PYPROJECT["project"]["optional-dependencies"]["dev"])
BUILD = pins(PYPROJECT["build-system"]["requires"])


def test_full_lock_pins_runtime_dev_and_build_dependencies_at_pyprojects_versions() -> None:
    lock = locked(ROOT / "requirements" / "lock.txt")
    for name, version in (RUNTIME | DEV | BUILD).items():
        assert name in lock, f"{name} is not in requirements/lock.txt: {FIX}"
        assert lock[name][0] == version, f"requirements/lock.txt has {name} {lock[name][0]}, pyproject {version}: {FIX}"


def test_runtime_lock_pins_the_runtime_dependencies_and_agrees_with_the_full_lock() -> None:
    runtime, full = locked(ROOT / "requirements" / "runtime.lock.txt"), locked(ROOT / "requirements" / "lock.txt")
    for name, version in RUNTIME.items():
        assert runtime.get(name, ("missing", 0))[0] == version, f"runtime.lock.txt: {name} is not {version}: {FIX}"
    assert not (set(DEV) - set(RUNTIME)) & set(runtime), "dev tools leaked into runtime.lock.txt"
    full_versions = {name: version for name, (version, _) in full.items()}
    differing = {n: (v, full_versions.get(n)) for n, (v, _) in runtime.items() if full_versions.get(n) != v}
    assert differing == {}, f"the two locks disagree (runtime, full): {differing}: {FIX}"


def test_every_locked_distribution_carries_a_hash() -> None:
    for name in ("lock.txt", "runtime.lock.txt"):
        lock = locked(ROOT / "requirements" / name)
        assert len(lock) > len(RUNTIME)
        unhashed = sorted(n for n, (_, hashes) in lock.items() if hashes == 0)
        assert unhashed == [], f"requirements/{name} has entries without --hash: {unhashed}: {FIX}"
