"""The RDS query protocol as the emulator needs it: the form a client posts, the XML errors it expects back, and the
``DBInstance`` elements of moto's answers that the emulator rewrites.

RDS speaks AWS's query protocol: ``POST /`` with a form body (``Action=...&Version=2014-10-31&...``) and XML answers
in the ``http://rds.amazonaws.com/doc/2014-10-31/`` namespace; an error is an ``ErrorResponse`` whose ``Code`` the SDK
turns into the exception's name (botocore reads ``Throttling``/``ThrottlingException`` as throttling and retries it).
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

NS = "http://rds.amazonaws.com/doc/2014-10-31/"
VERSION = "2014-10-31"
ET.register_namespace("", NS)


def tag(name: str) -> str:
    """``name`` in RDS's namespace, as ElementTree spells it."""
    return f"{{{NS}}}{name}"


def parse_form(body: bytes) -> dict[str, str]:
    """The request's parameters (the last value wins, as AWS reads a repeated scalar)."""
    return dict(parse_qsl(body.decode(), keep_blank_values=True))


def encode_form(params: dict[str, str]) -> bytes:
    return urlencode(params).encode()


def request_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class RdsError(Exception):
    """An error RDS answers with: its code, message and HTTP status (``Sender`` errors are 400, ours 5xx)."""

    code: str
    message: str
    status: int = 400

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def body(self) -> bytes:
        kind = "Sender" if self.status < 500 else "Receiver"
        root = ET.Element(tag("ErrorResponse"))
        error = ET.SubElement(root, tag("Error"))
        ET.SubElement(error, tag("Type")).text = kind
        ET.SubElement(error, tag("Code")).text = self.code
        ET.SubElement(error, tag("Message")).text = self.message
        ET.SubElement(root, tag("RequestId")).text = request_id()
        return ET.tostring(root)


def is_true(value: str | None) -> bool:
    return (value or "").lower() == "true"


def instances(root: ET.Element) -> list[ET.Element]:
    """Every ``DBInstance`` element in an answer (Describe holds many, Create/Modify/Delete one)."""
    return list(root.iter(tag("DBInstance")))


def snapshots(root: ET.Element) -> list[ET.Element]:
    """Every ``DBSnapshot`` element in an answer."""
    return list(root.iter(tag("DBSnapshot")))


def field(instance: ET.Element, name: str) -> str:
    return instance.findtext(tag(name)) or ""


def set_field(instance: ET.Element, name: str, value: str) -> None:
    node = instance.find(tag(name))
    if node is None:
        node = ET.SubElement(instance, tag(name))
    node.text = value


def set_pending(instance: ET.Element, pending: dict[str, str]) -> None:
    """Writes ``PendingModifiedValues`` (what waits for the maintenance window) into an instance element."""
    node = instance.find(tag("PendingModifiedValues"))
    if node is not None:
        instance.remove(node)
    if pending:
        node = ET.SubElement(instance, tag("PendingModifiedValues"))
        for name, value in sorted(pending.items()):
            ET.SubElement(node, tag(name)).text = value


def answer(action: str, instance: ET.Element) -> bytes:
    """An ``<Action>Response`` holding one ``DBInstance`` (the shape of Create/Modify/Delete answers)."""
    root = ET.Element(tag(f"{action}Response"))
    result = ET.SubElement(root, tag(f"{action}Result"))
    result.append(instance)
    meta = ET.SubElement(root, tag("ResponseMetadata"))
    ET.SubElement(meta, tag("RequestId")).text = request_id()
    return ET.tostring(root)


def error_of(body: bytes) -> RdsError | None:
    """The error in an answer body, if it is one."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    code = root.findtext(f"{tag('Error')}/{tag('Code')}")
    if code is None:
        return None
    return RdsError(code, root.findtext(f"{tag('Error')}/{tag('Message')}") or "")
