"""What the operator and the instance manager agree on about backups: the file names of the repository's key pair
in the Secret the operator copies for the instances (``<cluster>-backup-credentials``, mounted at
``/etc/kanri/backup``)."""

from __future__ import annotations

__all__ = ["ACCESS_KEY_FILE", "SECRET_KEY_FILE"]

ACCESS_KEY_FILE = "ACCESS_KEY_ID"
SECRET_KEY_FILE = "ACCESS_SECRET_KEY"
