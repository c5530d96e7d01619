"""Failed admin logins lock that account out from that address, through the real Daphne.

Requests come from two loopback addresses (127.0.0.1 and 127.0.0.2), so the
client address Daphne puts in REMOTE_ADDR differs between them.
"""

from __future__ import annotations

import http.client
import re
import uuid
from urllib.parse import urlencode

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model

from tests.support.stack import Stack

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "the-right-password"


class AdminLogin:
    """Posts the admin's login form from one client address (its own CSRF cookie)."""

    def __init__(self, stack: Stack, address: str) -> None:
        self._port = stack.web_port
        self._address = address
        _, cookies, page = self._request("GET", LOGIN)
        cookie = re.search(r"csrftoken=([^;]+)", cookies)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert cookie is not None
        assert token is not None
        self._cookie, self._token = cookie[1], token[1]

    def _request(
        self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, str]:
        """Status, Set-Cookie and body of one request on a connection of its own."""
        connection = http.client.HTTPConnection(
            "127.0.0.1", self._port, timeout=30, source_address=(self._address, 0)
        )
        try:
            connection.request(method, path, body, headers or {})
            response = connection.getresponse()
            return response.status, response.getheader("Set-Cookie") or "", response.read().decode()
        finally:
            connection.close()

    def post(self, username: str, password: str, **headers: str) -> tuple[int, str]:
        """Log in; the status and the body of the answer."""
        form = {"username": username, "password": password, "csrfmiddlewaretoken": self._token}
        status, _, body = self._request(
            "POST",
            LOGIN,
            urlencode(form),
            {
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": f"csrftoken={self._cookie}",
                **headers,
            },
        )
        return status, body


def operator() -> str:
    name = f"throttled-{uuid.uuid4().hex[:8]}"
    get_user_model().objects.create_superuser(username=name, email="", password=PASSWORD)
    return name


def test_failed_logins_lock_the_account_out_from_that_address(stack: Stack) -> None:
    limit = settings.AXES_FAILURE_LIMIT
    assert limit > 1
    name, other = operator(), operator()
    here = AdminLogin(stack, "127.0.0.1")
    answers = [
        # A spoofed X-Forwarded-For changes nothing: the address is the socket's.
        here.post(name, f"wrong-{attempt}", **{"X-Forwarded-For": f"10.0.0.{attempt}"})
        for attempt in range(limit)
    ]
    assert [status for status, _ in answers] == [200] * (limit - 1) + [429]
    assert "Please enter the correct username and password" in answers[0][1]
    lockout = "Too many failed logins for this account from your address: try again in 15 minutes."
    assert answers[-1][1] == lockout
    attempts = apps.get_model("axes", "AccessAttempt").objects.filter(username=name)
    assert list(attempts.values_list("ip_address", "failures_since_start")) == [
        ("127.0.0.1", limit)
    ]
    # Now even the right password is refused, from this address...
    assert here.post(name, PASSWORD) == (429, lockout)
    # ...but not from another address, and another account is not locked.
    status, _ = AdminLogin(stack, "127.0.0.2").post(name, PASSWORD)
    assert status == 302
    status, _ = here.post(other, PASSWORD)
    assert status == 302
