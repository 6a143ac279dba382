"""The local cluster for development and tests: a real control plane built from ``controlplane/``."""

from kanri.local.build import BuildError, controlplane_binary
from kanri.local.controlplane import ControlPlane, ControlPlaneError, Endpoint

__all__ = ["BuildError", "ControlPlane", "ControlPlaneError", "Endpoint", "controlplane_binary"]
