"""JSON Schema pieces shared by capabilities: binary results as the wire carries them."""

from __future__ import annotations

from typing import Any


def binary_result(mime_type: dict[str, Any], what: str) -> dict[str, Any]:
    """A binary result: inline BinaryData, or a download reference when too large."""
    common: dict[str, Any] = {
        "mimeType": mime_type,
        "size": {"type": "integer", "minimum": 0, "description": "Bytes."},
        "filename": {"type": "string"},
    }
    return {
        "oneOf": [
            {
                "title": "BinaryData",
                "type": "object",
                "properties": {
                    "content": {"type": "string", "contentEncoding": "base64"},
                    "encoding": {"const": "base64"},
                    **common,
                },
                "required": ["content", "mimeType", "encoding", "size", "filename"],
            },
            {
                "title": f"Download reference, for {what} too large to inline",
                "type": "object",
                "properties": {
                    "downloadUrl": {"type": "string", "format": "uri"},
                    "expiresAt": {"type": "string", "format": "date-time"},
                    **common,
                },
                "required": ["downloadUrl", "mimeType", "size", "filename", "expiresAt"],
            },
        ]
    }
