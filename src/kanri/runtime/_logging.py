"""Structured JSON logs: one object per line, carrying whatever the caller bound (a controller binds controller,
namespace, name, uid, generation and reconcile_id for the duration of each reconcile)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", *, json: bool = True) -> None:
    """Configure structlog (and the standard ``logging`` root, for libraries) to write to stderr."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    # Tracebacks never show local variables: a local may hold a secret (a password read for a connection), and the
    # console renderer's default (rich) formatter prints every frame's locals.
    console = structlog.dev.ConsoleRenderer(
        colors=False, exception_formatter=structlog.dev.RichTracebackFormatter(color_system=None, show_locals=False)
    )
    renderer: structlog.types.Processor = structlog.processors.JSONRenderer() if json else console
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=max(numeric, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
