"""Deletion: what deletionPolicy does when a DatabaseInstance goes (Retain lets the database go, Delete deletes it
after its final snapshot, ObserveOnly never deletes). ``steps`` is the step; the pure decision it follows is the
operation state machine's (``kanri.cloud.sync.operation.decide``), so a restart waits for the same deletion."""
