"""Backups: repositories, continuous archiving, base backups (PostgresBackup), schedules, clean-up, S3 and tenant
identities."""
