"""A pod's volumes on the node's disk, and the bind mounts that put them at each container's ``mountPath``.

Every volume gets a directory (or, for a PVC, its PV's directory); :class:`PodVolumes` fills them and
:func:`container_mounts` lists what the launcher (:mod:`kanri.local.node.launcher`) bind-mounts in the container's
own mount namespace:

| volume | on disk | notes |
|---|---|---|
| ``persistentVolumeClaim`` | the bound PV's ``local.path`` / ``hostPath.path`` | waits until the claim is bound |
| ``emptyDir`` | ``<pod dir>/volumes/empty-dir/<name>`` (mode 0777) | removed with the pod |
| ``hostPath`` | the path itself | ``DirectoryOrCreate``/``FileOrCreate`` create it |
| ``secret``, ``configMap``, ``downwardAPI``, ``projected`` | ``<pod dir>/volumes/<kind>/<name>`` | written atomically |

Secret, ConfigMap, downward-API and projected volumes are written the way the kubelet's atomic writer does: the
files live in a timestamped directory, ``..data`` links to it, and each top-level name links through ``..data``;
an update writes a new directory and swaps ``..data`` with one rename, so a reader never sees half a change.
Updates reach running containers (the directory is bind-mounted), except through ``subPath``, as in Kubernetes.

``fsGroup``: a writable volume's root directory (PVC, emptyDir) is given to the group, group-writable and setgid
when its group differs — the kubelet's ``OnRootMismatch`` — and the group is added to the container's groups.
Files of secret-like volumes are group-owned by ``fsGroup``. Nothing below a volume's root is changed: a
PostgreSQL data directory must keep its 0700.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kanri.local.node.containers import field_ref

Obj = dict[str, Any]


class VolumeNotReady(Exception):
    """A volume cannot be set up yet (claim not bound, Secret missing); the container waits and the node retries.
    ``reason`` is what the container's waiting state shows."""

    def __init__(self, message: str, reason: str = "ContainerCreating") -> None:
        super().__init__(message)
        self.reason = reason


class VolumeSources(Protocol):
    """Where volume contents come from (the kubelet implements it on its cache and client)."""

    def secret(self, namespace: str, name: str) -> Obj | None: ...

    def config_map(self, namespace: str, name: str) -> Obj | None: ...

    def claim_path(self, namespace: str, claim: str) -> Path:
        """The directory of the PV bound to the claim; raises :class:`VolumeNotReady`."""
        ...

    async def token(self, pod: Obj, service_account: str, audience: str | None, expiration: int) -> str: ...


@dataclass(frozen=True)
class Mount:
    """One bind mount for the launcher."""

    source: str
    target: str
    read_only: bool = False

    def as_json(self) -> Obj:
        return {"source": self.source, "target": self.target, "readOnly": self.read_only}


def _decoded(secret: Obj) -> dict[str, bytes]:
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    return data | {k: v.encode() for k, v in (secret.get("stringData") or {}).items()}


def _config_map_data(config_map: Obj) -> dict[str, bytes]:
    data = {k: v.encode() for k, v in (config_map.get("data") or {}).items()}
    return data | {k: base64.b64decode(v) for k, v in (config_map.get("binaryData") or {}).items()}


def _select(data: Mapping[str, bytes], source: Obj, what: str) -> dict[str, tuple[bytes, int | None]]:
    """Files of a secret/configMap source: every key, or just ``items`` (key → path, optional mode)."""
    items = source.get("items")
    if not items:
        return {key: (value, None) for key, value in data.items()}
    files: dict[str, tuple[bytes, int | None]] = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise VolumeNotReady(f"couldn't find key {item['key']} in {what}", "CreateContainerConfigError")
        files[item["path"]] = (data[item["key"]], item.get("mode"))
    return files


def _downward_files(pod: Obj, items: list[Obj]) -> dict[str, tuple[bytes, int | None]]:
    files: dict[str, tuple[bytes, int | None]] = {}
    for item in items:
        if "fieldRef" in item:
            path = item["fieldRef"]["fieldPath"]
            if path in ("metadata.labels", "metadata.annotations"):
                values = pod["metadata"].get(path.split(".")[1]) or {}
                text = "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(values.items()))
            else:
                text = field_ref(pod, path)
        else:
            text = _resource_field(pod, item["resourceFieldRef"])
        files[item["path"]] = (text.encode(), item.get("mode"))
    return files


def _resource_field(pod: Obj, ref: Obj) -> str:
    container = next(
        (c for c in pod["spec"]["containers"] if c["name"] == ref.get("containerName")), pod["spec"]["containers"][0]
    )
    section, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(section) or {}).get(name)
    # Without a limit the kubelet reports the node's allocatable; "0" says plainly that none is set.
    return str(value) if value is not None else "0"


def write_atomically(directory: Path, files: Mapping[str, tuple[bytes, int | None]], default_mode: int,
                     gid: int | None) -> bool:  # fmt: skip
    """Make ``directory`` hold exactly ``files`` (relative path → content, mode) with one atomic switch; False
    (and nothing touched) when it already does."""
    directory.mkdir(parents=True, exist_ok=True)
    data_link = directory / "..data"
    if data_link.is_symlink() and _same_content(directory / os.readlink(data_link), files, default_mode):
        return False
    stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    target = directory / stamp
    for relative, (content, mode) in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.chmod(path, mode if mode is not None else default_mode)
        if gid is not None:
            os.chown(path, 0, gid)
    target.mkdir(exist_ok=True)
    os.chmod(target, 0o755)
    old = os.readlink(data_link) if data_link.is_symlink() else None
    temporary = directory / "..data_tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(stamp)
    os.replace(temporary, data_link)
    tops = {relative.split("/", 1)[0] for relative in files}
    for entry in directory.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.name not in tops:
            entry.unlink()
    for top in tops:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    if old is not None and old != stamp:
        shutil.rmtree(directory / old, ignore_errors=True)
    return True


def _same_content(current: Path, files: Mapping[str, tuple[bytes, int | None]], default_mode: int) -> bool:
    present = {str(p.relative_to(current)) for p in current.rglob("*") if p.is_file()}
    if present != set(files):
        return False
    for relative, (content, mode) in files.items():
        path = current / relative
        if path.read_bytes() != content or stat.S_IMODE(path.stat().st_mode) != (mode or default_mode):
            return False
    return True


def fs_group(pod: Obj) -> int | None:
    value = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    return None if value is None else int(value)


def supplemental_groups(pod: Obj) -> list[int]:
    """``fsGroup`` and ``supplementalGroups``: groups every container process of the pod also has."""
    context = (pod.get("spec") or {}).get("securityContext") or {}
    groups = [int(g) for g in context.get("supplementalGroups") or []]
    group = fs_group(pod)
    return groups + ([group] if group is not None else [])


def give_root_to_group(path: Path, gid: int, mode: int) -> None:
    """``OnRootMismatch``: only the volume's root, and only when its group differs."""
    info = path.stat()
    if info.st_gid != gid:
        os.chown(path, info.st_uid, gid)
        os.chmod(path, mode | stat.S_ISGID)


@dataclass
class PodVolumes:
    """The volume directories of one pod; :meth:`prepare` (re)writes them, :meth:`paths` says where each is."""

    pod_dir: Path
    sources: VolumeSources
    paths: dict[str, Path] = field(default_factory=dict)
    token_expiry: dict[str, float] = field(default_factory=dict)

    async def prepare(self, pod: Obj, now: Callable[[], float]) -> bool:
        """Set up every volume of ``pod``; True when the content of a secret-like volume changed. Raises
        :class:`VolumeNotReady` for one that cannot be set up yet."""
        changed = False
        namespace = pod["metadata"]["namespace"]
        group = fs_group(pod)
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                path = self.sources.claim_path(namespace, volume["persistentVolumeClaim"]["claimName"])
                if group is not None:
                    give_root_to_group(path, group, 0o775)
            elif "emptyDir" in volume:
                path = self.pod_dir / "volumes" / "empty-dir" / name
                if not path.exists():
                    path.mkdir(parents=True)
                    os.chmod(path, 0o777)
                if group is not None:
                    give_root_to_group(path, group, 0o777)
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
                kind = volume["hostPath"].get("type") or ""
                if kind == "DirectoryOrCreate":
                    path.mkdir(parents=True, exist_ok=True)
                elif kind == "FileOrCreate" and not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.touch()
                elif not path.exists():
                    raise VolumeNotReady(f"hostPath type check failed: {path} does not exist")
            else:
                path = self.pod_dir / "volumes" / _kind_of(volume) / name
                files, mode = await self._files(pod, volume, now)
                changed |= write_atomically(path, files, mode, group)
            self.paths[name] = path
        return changed

    async def _files(self, pod: Obj, volume: Obj, now: Callable[[], float]) -> (
        tuple[dict[str, tuple[bytes, int | None]], int]
    ):  # fmt: skip
        namespace = pod["metadata"]["namespace"]
        if "secret" in volume:
            source = volume["secret"]
            return self._secret_files(namespace, source, source["secretName"]), source.get("defaultMode", 0o644)
        if "configMap" in volume:
            source = volume["configMap"]
            return self._config_map_files(namespace, source), source.get("defaultMode", 0o644)
        if "downwardAPI" in volume:
            source = volume["downwardAPI"]
            return _downward_files(pod, source.get("items") or []), source.get("defaultMode", 0o644)
        if "projected" in volume:
            source = volume["projected"]
            files: dict[str, tuple[bytes, int | None]] = {}
            for part in source.get("sources") or []:
                if "secret" in part:
                    files |= self._secret_files(namespace, part["secret"], part["secret"]["name"])
                elif "configMap" in part:
                    files |= self._config_map_files(namespace, part["configMap"])
                elif "downwardAPI" in part:
                    files |= _downward_files(pod, part["downwardAPI"].get("items") or [])
                elif "serviceAccountToken" in part:
                    files |= await self._token_file(pod, volume["name"], part["serviceAccountToken"], now)
            return files, source.get("defaultMode", 0o644)
        raise VolumeNotReady(f"volume {volume['name']!r}: unsupported volume type {_kind_of(volume)}", "Unsupported")

    def _secret_files(self, namespace: str, source: Obj, name: str) -> dict[str, tuple[bytes, int | None]]:
        secret = self.sources.secret(namespace, name)
        if secret is None:
            if source.get("optional"):
                return {}
            raise VolumeNotReady(f'secret "{name}" not found', "ContainerCreating")
        return _select(_decoded(secret), source, f"secret {namespace}/{name}")

    def _config_map_files(self, namespace: str, source: Obj) -> dict[str, tuple[bytes, int | None]]:
        config_map = self.sources.config_map(namespace, source["name"])
        if config_map is None:
            if source.get("optional"):
                return {}
            raise VolumeNotReady(f'configmap "{source["name"]}" not found', "ContainerCreating")
        return _select(_config_map_data(config_map), source, f"configmap {namespace}/{source['name']}")

    async def _token_file(self, pod: Obj, volume: str, source: Obj, now: Callable[[], float]) -> (
        dict[str, tuple[bytes, int | None]]
    ):  # fmt: skip
        """A bound service-account token, asked for again at 80% of its lifetime (as the kubelet does)."""
        key = f"{volume}/{source['path']}"
        cached = self.pod_dir / "tokens" / key.replace("/", "_")
        expiration = int(source.get("expirationSeconds", 3607))
        if not cached.exists() or now() >= self.token_expiry.get(key, 0):
            account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
            token = await self.sources.token(pod, account, source.get("audience"), expiration)
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(token)
            os.chmod(cached, 0o600)
            self.token_expiry[key] = now() + 0.8 * expiration
        return {source["path"]: (cached.read_bytes(), None)}


def _kind_of(volume: Obj) -> str:
    kinds = [k for k in volume if k != "name"]
    return kinds[0] if kinds else "unknown"


def container_mounts(container: Obj, volumes: PodVolumes) -> list[Mount]:
    """The bind mounts of one container's ``volumeMounts`` (``subPath`` inside the volume)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        base = volumes.paths.get(mount["name"])
        if base is None:
            raise VolumeNotReady(f"volume {mount['name']!r} is not defined in the pod", "CreateContainerConfigError")
        source = base / mount["subPath"] if mount.get("subPath") else base
        if mount.get("subPath") and not source.exists():
            source.mkdir(parents=True)
        mounts.append(Mount(str(source), mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts
