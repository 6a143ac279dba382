"""The conditions a DatabaseInstance reports, with reasons that say who must act.

``Ready``: the database is usable. ``Synced``: the provider has what the spec asks (False with a retryable reason
while the operator keeps trying — WaitingForAPIBudget, ProviderUnavailable, OperationInProgress — or with a
user-must-fix reason: the provider's refusal, a guardrail, an unsupported field). ``Unsupported``: fields set that
the provider cannot honour. ``Planned``: changes that need downtime, waiting for the maintenance window or an
approval."""

from __future__ import annotations

from kanri import kit
from kanri.cloud.budget.gateway import BudgetSpent
from kanri.cloud.providers.base import ProviderError, UserMustFix

__all__ = ["RETRYABLE_REASONS", "budget_spent", "provider_error", "synced", "user_must_fix"]

RETRYABLE_REASONS = frozenset({"WaitingForAPIBudget", "ProviderUnavailable", "OperationInProgress"})


def synced(ledger: kit.StatusLedger, ok: bool, reason: str, message: str) -> None:
    ledger.condition("Synced", ok, reason, message)


def user_must_fix(ledger: kit.StatusLedger, reason: str, message: str) -> None:
    """Nothing will change until the spec or class does: both conditions say why."""
    ledger.condition("Synced", False, reason, message)
    if not ledger.status.get("externalId"):
        ledger.condition("Ready", False, reason, message)


def provider_error(ledger: kit.StatusLedger, error: ProviderError) -> None:
    if isinstance(error, UserMustFix):
        named = f" (field {error.field})" if error.field else ""
        user_must_fix(ledger, error.reason, f"the provider refused{named}: {error.message}")
        return
    ledger.condition("Synced", False, "ProviderUnavailable", f"retrying: {error.message}")


def budget_spent(ledger: kit.StatusLedger, spent: BudgetSpent) -> None:
    # no wait time in the message: a message that changed every pass would write status (and trigger a pass) each time
    why = "the request budget is spent"
    if spent.throttled:
        why = "the provider throttled calls; backing off"
    elif spent.busy:
        why = "calls to the provider are still under way"
    ledger.condition("Synced", False, "WaitingForAPIBudget", f"{why} ({spent.budget}); calling again when it allows")
