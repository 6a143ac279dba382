"""kanri.kit: what every stateful operator on kanri.runtime shares.

A pass context and step outcomes, a status ledger, problems, a child writer, finalizer + deletionPolicy, acknowledged
requests and approvals, one-shot job pods, an in-pod agent client, per-object memory, the metric naming rule and
per-operator label sets. It imports kanri.runtime only. See docs/kit.md.
"""

from kanri.kit._agents import AgentAnswer, AgentClient, gather, pod_addresses, secret_token
from kanri.kit._children import ChildWriter, WriteOutcome
from kanri.kit._diff import is_subset, needs_apply, spec_hash, with_hash
from kanri.kit._fields import VolumeSize
from kanri.kit._finalizer import DeletionPolicy, carry_out, data_of, deletion_policy, finalize
from kanri.kit._images import image_for, image_table
from kanri.kit._labels import APP_INSTANCE, APP_NAME, MANAGED_BY, LabelSet
from kanri.kit._ledger import PrunedFieldError, StatusLedger, merge_patch
from kanri.kit._memory import ObjectMemory
from kanri.kit._metrics import metric_name
from kanri.kit._oneshot import OneShotPods, Verdict, one_shot, read_verdict, write_verdict
from kanri.kit._pass import ObjectPass, PassContext, Step, soonest
from kanri.kit._permissions import Permission, grant, needed
from kanri.kit._problems import Problem, Problems, child_conflict, child_rejected
from kanri.kit._process import manager_options, operator_parser
from kanri.kit._requests import Acknowledgement, acknowledge, acknowledged, approved, pending
from kanri.kit._status import KitStatus
from kanri.kit._volumes import EXPANSION_REFUSED, claim_template_size, claims_resizing, claims_to_grow, grow_claims

__all__ = [
    "APP_INSTANCE",
    "APP_NAME",
    "EXPANSION_REFUSED",
    "MANAGED_BY",
    "Acknowledgement",
    "AgentAnswer",
    "AgentClient",
    "ChildWriter",
    "DeletionPolicy",
    "KitStatus",
    "LabelSet",
    "ObjectMemory",
    "ObjectPass",
    "OneShotPods",
    "PassContext",
    "Permission",
    "Problem",
    "Problems",
    "PrunedFieldError",
    "StatusLedger",
    "Step",
    "Verdict",
    "VolumeSize",
    "WriteOutcome",
    "acknowledge",
    "acknowledged",
    "approved",
    "carry_out",
    "child_conflict",
    "child_rejected",
    "claim_template_size",
    "claims_resizing",
    "claims_to_grow",
    "data_of",
    "deletion_policy",
    "finalize",
    "gather",
    "grant",
    "grow_claims",
    "image_for",
    "image_table",
    "is_subset",
    "manager_options",
    "merge_patch",
    "metric_name",
    "needed",
    "needs_apply",
    "one_shot",
    "operator_parser",
    "pending",
    "pod_addresses",
    "read_verdict",
    "secret_token",
    "soonest",
    "spec_hash",
    "with_hash",
    "write_verdict",
]
