"""Structured JSON log lines on stdout (PostgreSQL's own log goes to stderr, untouched)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(**context: str) -> None:
    """One JSON object per line on stdout, each carrying ``context`` (instance, cluster, namespace)."""

    def add_context(_: object, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        for key, value in context.items():
            event.setdefault(key, value)
        return event

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_context,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    # libraries (aiohttp, psycopg) log through the standard library: warnings and up, to stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
