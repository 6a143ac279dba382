"""Credentials: the cluster's Secrets, generated once and never overwritten."""
