"""The operator's RBAC is exactly what its code uses, in both directions.

Two links are checked: (1) the write calls in kanri.postgres (``client.create/apply/patch/patch_status/delete`` and
the reconciler's ``apply`` helper, found in the source with ``ast``) are exactly the writes listed in
``kanri.postgres.operator.WRITES``; (2) the chart's rules (rendered by the real helm, in both modes) grant exactly
``permissions()`` plus the leader-election Lease rights, no verb more or less. A new client call without its grant,
or a grant no code needs, fails here rather than in a cluster.
"""

from __future__ import annotations

import ast

from kanri.postgres import kinds as postgres_kinds
from kanri.postgres.operator import CRD_UPGRADE, LEADER_ELECTION, WRITES, permissions
from kanri.runtime import Kind
from kanri.runtime import kinds as builtin_kinds
from tests.helm_support import CHILDREN_VERBS, CLIENT_VERBS, ROOT, Needed, as_grants, of_kind, rule_grants, template

POSTGRES_SRC = ROOT / "src" / "kanri" / "postgres"
KIND_CONSTANTS: dict[str, Kind] = {
    name: value for module in (builtin_kinds, postgres_kinds) for name, value in vars(module).items()
    if isinstance(value, Kind)
}  # fmt: skip
# kanri.runtime helpers called with the client and a kind: the finalizer helpers send a JSON patch.
HELPER_VERBS: dict[str, tuple[str, frozenset[str]]] = {
    "add_finalizer": ("", frozenset({"patch"})),
    "remove_finalizer": ("", frozenset({"patch"})),
}
# Writes the runtime sends on the operator's behalf, outside kanri.postgres: the controller GETs the object it
# reconciles; the EventRecorder creates Events and patches their count; blockOwnerDeletion needs finalizers/update.
RUNTIME_WRITES = {
    (postgres_kinds.POSTGRES_CLUSTER, ""): frozenset({"get"}),
    (postgres_kinds.POSTGRES_CLUSTER, "finalizers"): frozenset({"update"}),
    (builtin_kinds.EVENT, ""): frozenset({"create", "patch"}),
    # the PostgresPooler's pass (kit.ObjectPass): its StatusLedger patches status, re-reading the object on a conflict
    (postgres_kinds.POSTGRES_POOLER, ""): frozenset({"get"}),
    (postgres_kinds.POSTGRES_POOLER, "status"): frozenset({"patch"}),
}


def _is_client(node: ast.expr) -> bool:
    # client.x, self.client.x, self.r.client.x, self._client.x
    return (isinstance(node, ast.Name) and node.id == "client") or (
        isinstance(node, ast.Attribute) and node.attr in ("client", "_client")
    )


def _is_children(node: ast.expr) -> bool:
    # ctx.children.x: kit's child writer
    return isinstance(node, ast.Attribute) and node.attr == "children"


def _kind_of(arg: ast.expr) -> Kind | None:
    if isinstance(arg, ast.Name) and arg.id in KIND_CONSTANTS:
        return KIND_CONSTANTS[arg.id]
    return None


def writes_in_code() -> tuple[Needed, list[str]]:
    """(Every write the postgres package sends, per kind; the calls whose kind is a variable, by location)."""
    found: Needed = {}
    generic: list[str] = []
    for path in sorted(POSTGRES_SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func, where = node.func, f"{path.relative_to(ROOT)}:{node.lineno}"
            verbs: tuple[str, frozenset[str]] | None = None
            kind_arg = node.args[0]
            if isinstance(func, ast.Attribute) and func.attr in CLIENT_VERBS and _is_client(func.value):
                verbs = CLIENT_VERBS[func.attr]
            elif isinstance(func, ast.Attribute) and func.attr == "apply" and isinstance(func.value, ast.Name):
                # The pass's own ``self.apply(KIND, desired)`` (``step.apply`` in a concern's step written against
                # the pass's Protocol): sync.ensure, a server-side apply.
                verbs = CLIENT_VERBS["apply"] if func.value.id in ("self", "step") else None
            elif isinstance(func, ast.Attribute) and func.attr in CHILDREN_VERBS and _is_children(func.value):
                verbs = ("", CHILDREN_VERBS[func.attr])  # kit's child writer (the PostgresPooler's pass)
            elif isinstance(func, ast.Name) and func.id in HELPER_VERBS and len(node.args) > 1:
                verbs, kind_arg = HELPER_VERBS[func.id], node.args[1]
            if verbs is None:
                continue
            kind = _kind_of(kind_arg)
            if kind is None:
                generic.append(where)
                continue
            key = (kind, verbs[0])
            found[key] = found.get(key, frozenset()) | verbs[1]
    return found, generic


def listed() -> Needed:
    table: Needed = {}
    for p in WRITES:
        key = (p.kind, p.subresource)
        table[key] = table.get(key, frozenset()) | p.verbs
    return table


def test_the_write_table_is_exactly_the_writes_the_code_sends() -> None:
    found, generic = writes_in_code()
    # The only calls with a variable kind are the generic helpers every applied kind goes through (sync.ensure and
    # the reconciler's apply wrapper); the kinds reach them through ``self.apply(KIND, …)``, counted above.
    assert {g.split(":")[0] for g in generic} <= {
        "src/kanri/postgres/cluster/sync.py",
        "src/kanri/postgres/cluster/reconciler.py",
    }, generic
    in_code = found | {k: found.get(k, frozenset()) | v for k, v in RUNTIME_WRITES.items()}
    # Its own CRDs are read (is v1beta1 still stored?) only on the way to upgrading them: CRD_UPGRADE's rights.
    upgrade = {(p.kind, p.subresource): p.verbs for p in CRD_UPGRADE}
    crd_reads = {k: v for k, v in in_code.items() if k[0] == builtin_kinds.CRD}
    assert all(v <= upgrade.get(k, frozenset()) for k, v in crd_reads.items()), f"beyond CRD_UPGRADE: {crd_reads}"
    in_code = {k: v for k, v in in_code.items() if k[0] != builtin_kinds.CRD}
    table = listed()
    missing = {k: v - table.get(k, frozenset()) for k, v in in_code.items() if v - table.get(k, frozenset())}
    unused = {k: v - in_code.get(k, frozenset()) for k, v in table.items() if v - in_code.get(k, frozenset())}
    assert not missing, f"writes the code sends that WRITES lacks: {as_grants(missing)}"
    assert not unused, f"writes WRITES lists that no code sends: {as_grants(unused)}"


def test_the_cluster_role_is_exactly_what_the_operator_needs() -> None:
    objects = template()
    (role,) = [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == "kanri-operator"]
    assert rule_grants(role["rules"]) == as_grants(permissions()), (
        f"chart grants beyond the code: {rule_grants(role['rules']) - as_grants(permissions())}; "
        f"needed but not granted: {as_grants(permissions()) - rule_grants(role['rules'])}"
    )
    (lease_role,) = of_kind(objects, "Role")
    assert rule_grants(lease_role["rules"]) == as_grants({(p.kind, p.subresource): p.verbs for p in LEADER_ELECTION})


def test_namespaced_mode_grants_the_same_rights() -> None:
    objects = template("watchNamespaces={team-a}")
    # What the operator's ServiceAccount holds: the roles its bindings name (the users' aggregated roles and the
    # scrapers' role are bound by others); the metrics' TokenReview + SubjectAccessReview come with the runtime.
    bound = {b["roleRef"]["name"] for b in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding")}
    roles = [r for r in of_kind(objects, "Role") + of_kind(objects, "ClusterRole") if r["metadata"]["name"] in bound]
    granted = set().union(*(rule_grants(o["rules"]) for o in roles))
    leases = as_grants({(p.kind, p.subresource): p.verbs for p in LEADER_ELECTION})
    metrics_auth = {("authentication.k8s.io", "tokenreviews", "create"),
                    ("authorization.k8s.io", "subjectaccessreviews", "create")}  # fmt: skip
    assert granted == as_grants(permissions()) | leases | metrics_auth


def test_the_operator_holds_no_right_to_escalate_or_reach_into_pods() -> None:
    # Belt and braces for the review: whatever the table says, none of these may appear.
    granted = as_grants(permissions())
    groups_resources = {(g, r) for g, r, _ in granted}
    assert not {r for g, r in groups_resources if g == "rbac.authorization.k8s.io"}
    assert not {r for _, r in groups_resources if r in ("pods/exec", "pods/attach", "pods/portforward", "nodes/proxy",
                                                        "namespaces", "serviceaccounts/token")}  # fmt: skip
    # Nodes: one read by name (is the primary's node cordoned?), nothing that lists, watches or writes them.
    assert {v for g, r, v in granted if (g, r) == ("", "nodes")} <= {"get"}
    assert not {v for *_, v in granted if v in ("bind", "escalate", "impersonate", "*")}
    assert not {g for g, _ in groups_resources if g == "admissionregistration.k8s.io"}
