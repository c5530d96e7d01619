"""JSON Schema pieces shared by capabilities: binary inputs and results as the wire carries them."""

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


# The key of an upload reference (capabilities/jobs/uploads.py, docs/uploads.md).
UPLOAD_REFERENCE_KEY = "uploadId"


def binary_input(description: str, *, content_description: str) -> dict[str, Any]:
    """A binary input: inline BinaryData (base64), or a reference to an upload (ours).

    One object schema, so that errors name the field (`params.image.content`) and the
    server's size limit can sit on `content` as its maxLength. With `uploadId` the
    object is a reference: `content` must then be absent, and the other fields are
    what the upload route answered (informative).
    """
    return {
        "title": "BinaryData, or an upload reference",
        "description": description,
        "type": "object",
        "properties": {
            "content": {"type": "string", "minLength": 1, "contentEncoding": "base64"},
            UPLOAD_REFERENCE_KEY: {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "description": "An upload of this session (POST /abp/uploads), instead of content.",
            },
            "mimeType": {"type": "string", "maxLength": 255, "description": content_description},
            "encoding": {"const": "base64", "default": "base64"},
            "size": {
                "type": "integer",
                "minimum": 0,
                "maximum": 2**63 - 1,  # any byte count fits in 64 bits
                "description": "Ignored.",
            },
            "filename": {"type": "string", "maxLength": 255, "description": "Ignored."},
            "expiresAt": {"type": "string", "maxLength": 64, "description": "Ignored."},
        },
        "additionalProperties": False,
        "if": {"required": [UPLOAD_REFERENCE_KEY]},
        "then": {"not": {"required": ["content"]}},
        "else": {"required": ["content"]},
    }
