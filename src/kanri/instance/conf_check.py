"""Does PostgreSQL accept a ``postgresql.conf``? Asked of PostgreSQL itself, before the file is written.

A bad value PostgreSQL only logs on reload (``work_mem = 'lots'``) becomes a FATAL at the next start, and a preload
library that is not installed makes every later start fail. So every candidate file is run through
``postgres -D PGDATA --config-file=<candidate> -C <name>``: the postmaster reads the file (and
``postgresql.auto.conf``) exactly as at startup, checks every value, prints one setting and exits, without touching
the data directory (it stops before the lock file, so it works beside the running server; about 10 ms). Its log
names each bad parameter. PostgreSQL does not load libraries at that point, so the effective ``*_preload_libraries``
lists are printed and each name looked up in ``pg_config --pkglibdir``.

Known gaps: an unknown parameter stops the check at the first one (hence :func:`choose`'s rounds); values that only
fail against catalogs (``default_text_search_config``), cross-parameter limits checked later at startup, and
resource limits (``shared_buffers`` larger than the machine) are not caught.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kanri.contract.parameters import PRELOAD_PARAMETERS
from kanri.instance.config import Settings

_NAMED = re.compile(r'parameter "(?P<name>[A-Za-z0-9_.$]+)"')
_LINE = re.compile(r"^.*?\b(?P<level>LOG|FATAL|ERROR|DETAIL|HINT|WARNING):\s+(?P<text>.*)$")


@dataclass
class CheckResult:
    """What PostgreSQL said about one candidate file."""

    loads: bool
    by_parameter: dict[str, str] = field(default_factory=dict)  # lower-case name → message (no value in it)
    other: list[str] = field(default_factory=list)  # problems naming no parameter


def _message(text: str, name: str) -> str:
    """PostgreSQL's message about ``name`` without the value it echoes (the value may be anything a user typed)."""
    if text.startswith("unrecognized configuration parameter"):
        return f'unrecognized configuration parameter "{name}"'
    if " is outside the valid range for parameter " in text:
        return "value is outside the valid range" + text.split(" is outside the valid range", 1)[1]
    if text.startswith("invalid value for parameter"):
        return f'invalid value for parameter "{name}"'
    return f'PostgreSQL refused parameter "{name}"'


def parse_log(output: str, values: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The problems in ``postgres -C``'s log: per parameter (lower-case name), and those naming none.

    DETAIL and HINT lines are appended to the message before them unless they contain the value."""
    by_parameter: dict[str, str] = {}
    other: list[str] = []
    current: str | None = None
    for line in output.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        level, text = match["level"], match["text"].strip()
        if level in ("DETAIL", "HINT"):
            value = values.get(current or "", "")
            if current is not None and not (value and value in text):
                by_parameter[current] = f"{by_parameter[current]} ({text.rstrip('.')})"
            continue
        current = None
        if text.startswith("configuration file") and "contains errors" in text:
            continue  # the summary of the lines before it
        if (named := _NAMED.search(text)) is not None:
            current = named["name"].lower()
            by_parameter.setdefault(current, _message(text, current))
        elif level in ("FATAL", "ERROR"):
            other.append(text.split(" in file ", 1)[0])  # never a file's content, at most its name
    return by_parameter, other


def library_missing(pkglibdir: Path, name: str) -> bool:
    """Whether the library ``name`` (as listed in ``*_preload_libraries``) has no file in ``pkglibdir``."""
    base = name.strip().strip('"').removeprefix("$libdir/")
    return not any((pkglibdir / candidate).is_file() for candidate in (base, base + ".so"))


class ConfChecker:
    """Runs the candidate checks for one instance (the candidate file lives in the private socket directory)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pkglibdir: Path | None = None

    async def _run(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "LC_ALL": "C"},  # English messages: they are parsed
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def pkglibdir(self) -> Path:
        """Where the server looks for ``$libdir`` libraries (asked once)."""
        if self._pkglibdir is None:
            code, out, _ = await self._run(self.settings.binary("pg_config"), "--pkglibdir")
            # else the layout of an installation: <prefix>/bin/postgres and <prefix>/lib
            prefix = Path(self.settings.binary("postgres")).parent.parent
            self._pkglibdir = Path(out.strip()) if code == 0 and out.strip() else prefix / "lib"
        return self._pkglibdir

    async def check(self, text: str, values: Mapping[str, str]) -> CheckResult:
        """Would PostgreSQL start with ``text`` as its postgresql.conf (plus the data directory's auto.conf)?
        ``values`` are the user parameters in it, so that no message quotes one."""
        self.settings.socket_dir.mkdir(parents=True, exist_ok=True)
        candidate = self.settings.socket_dir / "kanri-candidate.conf"
        fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        try:
            result = CheckResult(loads=True)
            for name in PRELOAD_PARAMETERS:
                code, out, err = await self._run(
                    self.settings.binary("postgres"),
                    "-D",
                    str(self.settings.pgdata),
                    f"--config-file={candidate}",
                    "-C",
                    name,
                )
                if code != 0:
                    by_parameter, other = parse_log(err, values)
                    if not by_parameter and not other:
                        other = [f"postgres -C exited with code {code}"]
                    return CheckResult(False, by_parameter, other)
                missing = [
                    lib
                    for lib in out.strip().split(",")
                    if lib.strip() and library_missing(await self.pkglibdir(), lib)
                ]
                if missing:
                    result.loads = False
                    result.by_parameter[name] = "library not installed: " + ", ".join(
                        m.strip().strip('"') for m in missing
                    )
            return result
        finally:
            candidate.unlink(missing_ok=True)


@dataclass
class Choice:
    """The user parameters to write, and why the others are left out or what else keeps the file from loading."""

    parameters: dict[str, str]
    refused: dict[str, str]  # name → PostgreSQL's message: keeps its last good value, or stays unset
    elsewhere: dict[str, str]  # bad parameters this manager does not write (postgresql.auto.conf) → message
    other: list[str]
    loads: bool


async def choose(
    checker: ConfChecker,
    render: Callable[[Mapping[str, str]], str],
    wanted: Mapping[str, str],
    last_good: Mapping[str, str],
) -> Choice:
    """Drop (or roll back to its last good value) each parameter PostgreSQL refuses, until the file loads.

    One round per refusal batch: PostgreSQL reports every bad value at once but stops at the first unknown name."""
    candidate = dict(wanted)
    refused: dict[str, str] = {}
    result = CheckResult(loads=False)
    for _ in range(len(wanted) + 2):
        result = await checker.check(render(candidate), candidate)
        if result.loads:
            break
        culprits = {n: m for n, m in result.by_parameter.items() if n in candidate}
        if not culprits:
            break
        for name, message in culprits.items():
            refused.setdefault(name, message)
            if name in last_good and last_good[name] != candidate[name]:
                candidate[name] = last_good[name]
            else:
                del candidate[name]
    elsewhere = {n: m for n, m in result.by_parameter.items() if n not in candidate and n not in refused}
    return Choice(candidate, refused, elsewhere, list(result.other), result.loads)
