"""Why a connection is refused or closed: stable reasons, close codes, messages."""

# WebSocket close code of each refusal (4000-4999 are the application's). Daphne
# sends no close reason, so a `notifications/error` frame before the close names it.
CLOSE_CODES = {
    "missing-credentials": 4401,
    "invalid-credentials": 4401,
    "key-revoked": 4403,
    "user-inactive": 4403,
    "token-revoked": 4403,
    "expired-credentials": 4419,
    "wrong-audience": 4401,
    "insufficient-scope": 4403,
    "token-in-query": 4401,
}
# Closed after an initialize refused for too many open sessions (RATE_LIMITED).
TOO_MANY_SESSIONS_CLOSE_CODE = 4429
REFUSAL_MESSAGES = {
    "missing-credentials": "An agent key or access token is required (Authorization: Bearer, "
    "a subprotocol abp.bearer.<key>, or ?access_token=).",
    "invalid-credentials": "The agent key, access token or page token is not valid.",
    "key-revoked": "The agent key was revoked.",
    "user-inactive": "The user this credential acts for was deactivated.",
    "token-revoked": "The access token was revoked.",
    "expired-credentials": "The page token expired; reload the page (or fetch a new one).",
    "wrong-audience": "The access token was not issued for this server: ask for it with this "
    "server's URL as its resource (RFC 8707).",
    "insufficient-scope": "The access token lacks a scope this needs.",
    "token-in-query": "Send the access token in the Authorization header, not the URL.",
}
# Access withdrawn from open connections (endings/access_withdrawal.py): the close
# reason, and what their calls and sessions are ended with (the cancel reason).
WITHDRAWN_BECAUSE = {
    "key-revoked": "agent key revoked",
    "user-inactive": "user deactivated",
    "token-revoked": "access token revoked",
}
