"""kanri (管理): a Kubernetes operator toolkit in Python, and the PostgreSQL operator built on it."""

__version__ = "0.1.0"
