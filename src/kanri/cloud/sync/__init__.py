"""Sync: desired state to provider calls, kept safe across restarts by the operation on record in
``status.operation``. The pure decisions are ``desired`` (instance and class resolved into the provider's Desired),
``diff`` (the fields that differ and whether they may be sent now), ``operation`` (from the record and what the
provider reports: call, wait, succeeded, failed) and ``polling`` (how soon to look again); the steps are
``operations`` (starting and advancing an operation) and ``instance`` (one pass over a live instance)."""
