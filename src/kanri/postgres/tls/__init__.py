"""TLS: the per-cluster CA and server certificates, and the step that keeps them."""
