"""The MCP door's key check, in-process: what it answers before the SDK sees a request."""

from __future__ import annotations

import asyncio
import json
from unittest import mock

from django.db import OperationalError

from capabilities.mcp_door import app


def scope_with(authorization: str) -> dict[str, object]:
    return {
        "type": "http",
        "method": "POST",
        "path": app.PATH,
        "headers": [(b"authorization", authorization.encode())],
        "client": ("127.0.0.1", 50000),
        "query_string": b"",
    }


def test_a_key_that_cannot_be_checked_now_is_a_retryable_503_not_a_bare_500(
    database: None,
) -> None:
    # A key is looked up in the database thread (whose connection the guard watches).
    restarting = OperationalError("terminating connection due to administrator command")
    with mock.patch("capabilities.access.agent_keys.find_key", side_effect=restarting):
        principal, refused = asyncio.run(
            app._authenticate(scope_with("Bearer abp_abcdefgh_" + "x" * 43))
        )
    assert principal is None
    assert refused is not None
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    error = json.loads(bytes(refused.body))["error"]
    assert error["data"] == {"code": "INTERNAL_ERROR", "retryable": True}


def test_no_key_is_a_401_that_says_why() -> None:
    principal, refused = asyncio.run(app._authenticate(scope_with("")))
    assert principal is None
    assert refused is not None
    assert refused.status_code == 401
    assert json.loads(bytes(refused.body))["error"]["data"] == {"reason": "missing-credentials"}
