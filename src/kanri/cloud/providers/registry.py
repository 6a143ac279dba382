"""The provider of a DatabaseClass: each provider module's ``provider(setup)``, looked up by ``spec.provider``."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from kanri.cloud.providers.base import Provider, ProviderSetup, UserMustFix

__all__ = ["MODULES", "build"]

MODULES = {"aws": "kanri.cloud.providers.aws", "kanri": "kanri.cloud.providers.kanri"}


def build(setup: ProviderSetup) -> Provider:
    """The provider the class configures (imported on first use: an operator serving only aws classes never
    loads the kanri provider)."""
    module = MODULES.get(setup.spec.provider)
    if module is None:
        raise UserMustFix(f"provider {setup.spec.provider!r} is not known", reason="UnknownProvider")
    factory: Callable[[ProviderSetup], Provider] = importlib.import_module(module).provider
    return factory(setup)
