"""Providers of the cloud operator: the Protocol (base) and one module per provider (aws, kanri)."""
