"""Topology: which instances a cluster has, their storage, and restarts."""
