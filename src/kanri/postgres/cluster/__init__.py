"""The PostgresCluster reconcile pass and what it shares: observing instances, status, problems, deletion, child
writes."""
