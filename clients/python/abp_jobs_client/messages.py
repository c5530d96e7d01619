"""ABP messages, without I/O: what the client sends, and what it makes of the answers."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "0.1"
# Inputs of this size or more go to the upload route, not into the frame as base64.
UPLOAD_FROM_BYTES = 64 * 1024


def envelope(type_: str, id_: str, payload: dict[str, Any]) -> str:
    """One frame."""
    return json.dumps({"type": type_, "id": id_, "payload": payload})


def initialize(
    name: str,
    version: str,
    resume: tuple[str, str] | None,
    awaiting: list[str] | None = None,
) -> dict[str, Any]:
    """An `initialize` payload; `resume`: (sessionId, resumeToken) to take a session back.

    `awaiting`: the callIds still waiting for their answer; the reply's `heldCalls` says
    which of them reached the server (docs/protocol.md, resuming a session).
    """
    payload: dict[str, Any] = {
        "agent": {"name": name, "version": version},
        "protocolVersion": PROTOCOL_VERSION,
        "features": {"notifications": False, "progress": True},
    }
    if resume is not None:
        payload["resume"] = {"sessionId": resume[0], "token": resume[1]}
        if awaiting:
            payload["resume"]["awaiting"] = awaiting
    return payload


def call(
    capability: str, params: dict[str, Any], call_id: str, timeout_ms: int | None
) -> dict[str, Any]:
    """A `capabilities/call` payload; the callId doubles as the progress token."""
    options: dict[str, Any] = {"callId": call_id, "progressToken": call_id}
    if timeout_ms is not None:
        options["timeout"] = timeout_ms
    return {"capability": capability, "params": params, "options": options}


def resent(call_payload: dict[str, Any]) -> dict[str, Any]:
    """The call sent again after a resume: the server runs it unless it holds its callId."""
    return {**call_payload, "options": {**call_payload["options"], "resent": True}}


@dataclass(frozen=True)
class Blob:
    """Binary data: a result's file, or an input to send."""

    content: bytes
    mime_type: str = "application/octet-stream"
    filename: str | None = None

    def inline(self) -> dict[str, Any]:
        """As ABP's inline BinaryData (base64)."""
        return {
            "content": base64.b64encode(self.content).decode("ascii"),
            "mimeType": self.mime_type,
            "encoding": "base64",
        }


@dataclass(frozen=True)
class Progress:
    """A progress report for a call."""

    call_id: str
    progress: float | None
    total: float | None
    percentage: float | None
    stage: str | None
    position: int | None = None

    @classmethod
    def from_wire(cls, call_id: str, payload: dict[str, Any]) -> Progress:
        """From a `progress` message's payload."""
        return cls(
            call_id=call_id,
            progress=payload.get("progress"),
            total=payload.get("total"),
            percentage=payload.get("percentage"),
            stage=payload.get("stage"),
            position=payload.get("position"),
        )


@dataclass(frozen=True)
class Result:
    """A successful call's data (binary values as Blob) and how long it ran."""

    call_id: str
    data: dict[str, Any]
    duration_ms: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def binary_references(value: Any) -> list[dict[str, Any]]:
    """Every BinaryData object in a result's data (inline or a download link)."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if _is_inline(value) or "downloadUrl" in value:
            return [value]
        for item in value.values():
            found += binary_references(item)
    elif isinstance(value, list):
        for item in value:
            found += binary_references(item)
    return found


def with_blobs(value: Any, fetched: dict[str, bytes]) -> Any:
    """The data with every BinaryData replaced by a Blob (`fetched`: bytes by URL)."""
    if isinstance(value, dict):
        if _is_inline(value) or "downloadUrl" in value:
            content = (
                base64.b64decode(value["content"])
                if _is_inline(value)
                else fetched[value["downloadUrl"]]
            )
            return Blob(
                content,
                str(value.get("mimeType", "application/octet-stream")),
                value.get("filename"),
            )
        return {key: with_blobs(item, fetched) for key, item in value.items()}
    if isinstance(value, list):
        return [with_blobs(item, fetched) for item in value]
    return value


def _is_inline(value: dict[str, Any]) -> bool:
    return value.get("encoding") == "base64" and isinstance(value.get("content"), str)
