"""High availability: failover, switchover and the primary update, split brain."""
