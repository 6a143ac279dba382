"""The KeyValueStore's steps: each a free function of the pass context (kanri.kit.PassContext), in pass order."""

from __future__ import annotations

import secrets

from kanri import kit
from kanri import runtime as kr
from kanri.runtime.kinds import CONFIG_MAP, SECRET

from .api import APPROVE_REMOVAL, LABELS, ROTATE, ROTATED, KeyValueStoreSpec, Rotation, data_name, key_name


def spec_of(ctx: kit.PassContext) -> KeyValueStoreSpec:
    """Step 3: the typed spec; what the schema let through but the operator cannot use is a permanent error."""
    spec = KeyValueStoreSpec.model_validate(ctx.obj.get("spec") or {})
    if len(spec.data) > 256:
        raise kr.PermanentError("TooManyKeys", f"spec.data has {len(spec.data)} keys; at most 256")
    return spec


async def key_secret(ctx: kit.PassContext) -> kr.Result | None:
    """The generated key, created once and never owned: deletionPolicy decides its fate, a new store adopts it."""
    desired = {"metadata": {"name": key_name(ctx.name), "labels": LABELS.labels(ctx.name)},
               "stringData": {"key": secrets.token_urlsafe(32)}}  # fmt: skip
    if await ctx.children.create_once(SECRET, desired, owned=False) == "created":
        await ctx.events.normal(ctx.obj, "KeyCreated", f"generated Secret {key_name(ctx.name)}")
    return None


async def publish_data(ctx: kit.PassContext) -> kr.Result | None:
    """The data ConfigMap; removing keys waits for an approval that names them and this generation."""
    spec = spec_of(ctx)
    name = data_name(ctx.name)
    current = ctx.children.current(CONFIG_MAP, name) or {}
    removed = sorted(set(current.get("data") or {}) - set(spec.data))
    subject = f"{','.join(removed)} at generation {ctx.obj['metadata']['generation']}"
    if removed and kit.pending(ctx.obj, APPROVE_REMOVAL, "approve-removal") != subject:
        ctx.ledger.condition("Ready", False, "ApprovalRequired", f"removing keys {', '.join(removed)} deletes their "
                             f"values: annotate {APPROVE_REMOVAL}='{subject}' to approve")  # fmt: skip
        return None
    desired = {"metadata": {"name": name, "labels": LABELS.labels(ctx.name)}, "data": dict(spec.data)}
    outcome = await ctx.children.apply(CONFIG_MAP, desired)
    if outcome in ("conflict", "rejected"):
        ctx.ledger.condition("Ready", False, "NotPublished", f"ConfigMap {name} could not be written (see Degraded)")
        return None
    if removed:
        await kit.acknowledge(ctx.ledger, "approve-removal", subject, "Done", f"removed {', '.join(removed)}")
    ctx.ledger.stage("keys", len(spec.data))
    ctx.ledger.condition("Ready", True, "Published", f"{len(spec.data)} keys in ConfigMap {name}")
    return None


async def rotate_key(ctx: kit.PassContext) -> kr.Result | None:
    """A requested key rotation: the record is committed first, the Secret rewritten, then the request
    acknowledged and the record cleared in the pass's status write. Every step is safe to repeat."""
    record = ctx.ledger.record("rotation", Rotation)
    if record is None:
        asked = kit.pending(ctx.obj, ROTATE, "rotate-key")
        if asked is None:
            return None
        record = Rotation(request=asked)
        await ctx.ledger.commit("rotation", record)  # the intent, on record before the key changes
    name = key_name(ctx.name)
    secret = ctx.children.current(SECRET, name)
    if secret is None:
        ctx.requeue(1.0)  # created this pass; the cache has not seen it yet
        return None
    if (secret["metadata"].get("annotations") or {}).get(ROTATED) != record.request:
        body = {"metadata": {"annotations": {ROTATED: record.request},
                             "resourceVersion": secret["metadata"]["resourceVersion"]},
                "stringData": {"key": secrets.token_urlsafe(32)}}  # fmt: skip
        await ctx.client.patch(SECRET, name, body, ctx.namespace)
        await ctx.events.normal(ctx.obj, "KeyRotated", f"Secret {name} holds a new key (request {record.request})")
    ctx.ledger.stage("rotation", None)
    await kit.acknowledge(ctx.ledger, "rotate-key", record.request, "Done", f"Secret {name} holds a new key")
    return None


STEPS: tuple[kit.Step, ...] = (key_secret, publish_data, rotate_key)
