"""The Helm chart package that names the built images by digest: ``kanri-<version>.tgz``, deploy/helm/kanri with its
``digests.yaml`` filled from the catalog (``repository:tag`` → digest).

Why a package and not the chart in git: every change to kanri's Python code changes the operator image's digest, so
a digest committed in values.yaml would be stale at the next commit. The chart in git names images by tag (its
``digests.yaml`` is empty); ``make images`` packages the chart with the digests of the images it just built, and
that package is what is signed and installed (docs/install.md). Values (``image.digest``, ``postgres.digests``) still
win over the package's digests.

The package is reproducible: entries sorted, owned by 0:0, time-stamped ``SOURCE_DATE_EPOCH`` (0 when unset), and a
gzip header without name or time, so the same chart and digests give the same bytes (and the same signature input).
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import os
import tarfile
from pathlib import Path

import yaml

from kanri.images.catalog import BuiltImage

DIGESTS = "digests.yaml"
_HEADER = (
    "# The image digests of this chart package, by repository:tag: written by `make images` (kanri.images.chart)\n"
    "# from the images built with it. Values (image.digest, postgres.digests) win over these.\n"
)


def digests_yaml(images: list[BuiltImage]) -> str:
    """``digests.yaml`` naming every image of ``images`` (``repository:tag: digest``, sorted)."""
    digests = {f"{image.repository}:{image.tag}": image.digest for image in images}
    return _HEADER + yaml.safe_dump(dict(sorted(digests.items())), default_flow_style=False)


def _ignored(chart: Path) -> list[str]:
    """The file-name patterns of the chart's ``.helmignore`` (the simple, base-name kind it uses)."""
    try:
        lines = (chart / ".helmignore").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _chart_version(chart: Path) -> str:
    return str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])


def package_chart(chart: Path, images: list[BuiltImage], out_dir: Path) -> Path:
    """Write ``out_dir/<name>-<version>.tgz``: ``chart`` (a chart folder) with :func:`digests_yaml` of ``images`` as
    its ``digests.yaml``. Returns the package's path."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    name, version = str(meta["name"]), _chart_version(chart)
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    ignored = _ignored(chart)
    files = {
        p.relative_to(chart).as_posix(): p.read_bytes()
        for p in chart.rglob("*")
        if p.is_file() and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored)
    }
    files[DIGESTS] = digests_yaml(images).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size, info.mtime, info.mode = len(files[path]), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[path]))
    out_dir.mkdir(parents=True, exist_ok=True)
    package = out_dir / f"{name}-{version}.tgz"
    with package.open("wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(raw.getvalue())
    return package
