"""Two KafkaTopics naming one topic of one cluster: the older owns it; the other only reports the conflict.

Creation times have a resolution of one second, so within one second the KafkaTopic that already manages the topic
(its status names it and is not in conflict) wins, then the smaller uid. Deciding from the cache alone keeps the
answer the same in every pass and every replica."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]


def topic_name(obj: Obj) -> str:
    """The topic's name in Kafka: ``spec.topicName``, else the KafkaTopic's name."""
    return str((obj.get("spec") or {}).get("topicName") or obj["metadata"]["name"])


def _holds(obj: Obj) -> bool:
    status = obj.get("status") or {}
    return status.get("topicName") == topic_name(obj) and status.get("phase") != "Conflict"


def _age_key(obj: Obj) -> tuple[str, bool, str]:
    meta = obj["metadata"]
    return str(meta.get("creationTimestamp") or ""), not _holds(obj), str(meta.get("uid") or "")


def claimants(obj: Obj, topics: Iterable[Obj]) -> list[Obj]:
    """Every KafkaTopic (``obj`` included) that names ``obj``'s topic on its cluster, oldest first."""
    cluster, name = (obj.get("spec") or {}).get("cluster"), topic_name(obj)
    same = [t for t in topics if (t.get("spec") or {}).get("cluster") == cluster and topic_name(t) == name]
    if not any(t["metadata"].get("uid") == obj["metadata"].get("uid") for t in same):
        same.append(obj)
    return sorted(same, key=_age_key)


def owner(obj: Obj, topics: Iterable[Obj]) -> Obj:
    """The KafkaTopic that owns ``obj``'s topic."""
    return claimants(obj, topics)[0]
