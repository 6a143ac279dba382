"""The ``kanri`` command."""
