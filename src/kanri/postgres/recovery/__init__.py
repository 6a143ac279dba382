"""Recovery: bootstrapping a cluster from backups, and restore rehearsals."""
