"""kanri.runtime: a level-triggered controller runtime for Python operators.

The public API is this module's names; everything else is private. See docs/runtime.md.
"""

from kanri.runtime._cache import Cache, NotWatchedError
from kanri.runtime._client import Client, ClientMetrics, RetryPolicy, Unlimited
from kanri.runtime._clock import Clock, FakeClock, SystemClock
from kanri.runtime._conditions import get_condition, is_true, remove_condition, set_condition
from kanri.runtime._controller import Controller, ControllerOptions, Reconciler, Result
from kanri.runtime._conversion import Conversion, ConversionError, Conversions
from kanri.runtime._conversion_webhook import ConversionWebhook, WebhookOptions
from kanri.runtime._crd import CustomResource, PrinterColumn, Scale, SchemaError, crd_for, crd_yaml
from kanri.runtime._crd_upgrade import CrdDowngradeRefused, CrdUpgrade, CrdUpgradeFailed, upgrade_crds
from kanri.runtime._errors import ApiError, PermanentError, ReconcileError, TransientError
from kanri.runtime._events import EventRecorder
from kanri.runtime._finalizers import add_finalizer, finalizer_step, has_finalizer, remove_finalizer
from kanri.runtime._informer import Informer, WatchTiming
from kanri.runtime._install import CrdNotEstablished, install_crd
from kanri.runtime._kinds import Kind
from kanri.runtime._leader import LeaderElector, LeadershipLost
from kanri.runtime._logging import configure_logging
from kanri.runtime._manager import Manager, ManagerOptions
from kanri.runtime._model import (
    Condition,
    Conditions,
    IntOrString,
    KubeModel,
    Quantity,
    Rule,
    Time,
    cel,
    list_map,
    list_set,
    parse_quantity,
)
from kanri.runtime._ownership import child_name, controller_of, is_controlled_by, owner_reference, set_owner
from kanri.runtime._queue import Priority, Request, WorkQueue
from kanri.runtime._references import object_reference
from kanri.runtime._status import update_status
from kanri.runtime._storage_migration import MigrationResult, StorageMigration, StorageMigrationMetrics
from kanri.runtime._time import creation_time, deletion_time, format_time, parse_optional_time, parse_time
from kanri.runtime._view_source import view_source
from kanri.runtime._views import ObjectMetaView, OwnerReferenceView, as_view

__all__ = [
    "ApiError",
    "Cache",
    "Client",
    "ClientMetrics",
    "Clock",
    "Condition",
    "Conditions",
    "Controller",
    "ControllerOptions",
    "Conversion",
    "ConversionError",
    "ConversionWebhook",
    "Conversions",
    "CrdDowngradeRefused",
    "CrdNotEstablished",
    "CrdUpgrade",
    "CrdUpgradeFailed",
    "CustomResource",
    "EventRecorder",
    "FakeClock",
    "Informer",
    "IntOrString",
    "Kind",
    "KubeModel",
    "LeaderElector",
    "LeadershipLost",
    "Manager",
    "ManagerOptions",
    "MigrationResult",
    "NotWatchedError",
    "ObjectMetaView",
    "OwnerReferenceView",
    "PermanentError",
    "PrinterColumn",
    "Priority",
    "Quantity",
    "ReconcileError",
    "Reconciler",
    "Request",
    "Result",
    "RetryPolicy",
    "Rule",
    "Scale",
    "SchemaError",
    "StorageMigration",
    "StorageMigrationMetrics",
    "SystemClock",
    "Time",
    "TransientError",
    "Unlimited",
    "WatchTiming",
    "WebhookOptions",
    "WorkQueue",
    "add_finalizer",
    "as_view",
    "cel",
    "child_name",
    "configure_logging",
    "controller_of",
    "crd_for",
    "crd_yaml",
    "creation_time",
    "deletion_time",
    "finalizer_step",
    "format_time",
    "get_condition",
    "has_finalizer",
    "install_crd",
    "is_controlled_by",
    "is_true",
    "list_map",
    "list_set",
    "object_reference",
    "owner_reference",
    "parse_optional_time",
    "parse_quantity",
    "parse_time",
    "remove_condition",
    "remove_finalizer",
    "set_condition",
    "set_owner",
    "update_status",
    "upgrade_crds",
    "view_source",
]
