"""kanri.instance: the instance manager, PID 1 of every PostgreSQL pod.

It bootstraps the data directory (initdb or pg_basebackup), owns postgresql.conf and pg_hba.conf, runs ``postgres``
as its child, keeps replication slots, and answers the operator over a small HTTP API. It imports nothing else of
kanri: the pod image needs only psycopg, aiohttp, structlog and pydantic. See docs/instance-manager.md.
"""

from kanri.instance.config import ClusterConfig, Settings
from kanri.instance.manager import InstanceManager

__all__ = ["ClusterConfig", "InstanceManager", "Settings"]
