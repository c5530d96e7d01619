""" "Your jobs" over HTTP with Django's test client: the page behind a sign-in, the JSON
API for a session or an agent key, CSRF on a session's POST, and two users who can
never see, read or cancel each other's jobs."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.shortcuts import resolve_url
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.endings import key_revocation
from capabilities.jobs import download_links
from capabilities.models import AgentKey, CancelSource, Door, Job, JobStatus
from tests.support.user_jobs import Stops, job_for, new_user, record_stops

pytestmark = pytest.mark.usefixtures("database")

HOST = "127.0.0.1"
PAGE = "/abp/jobs/"
LIST = "/abp/jobs.json"


def detail(job_id: uuid.UUID) -> str:
    return f"/abp/jobs/{job_id}.json"


def cancel_url(job_id: uuid.UUID) -> str:
    return f"/abp/jobs/{job_id}/cancel"


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> Stops:
    return record_stops(monkeypatch)


def signed_in(user: Any, *, csrf: bool = False) -> Client:
    client = Client(HTTP_HOST=HOST, enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def with_key(key: str) -> Client:
    """A client that sends the key on every request, and checks CSRF as a browser would."""
    return Client(HTTP_HOST=HOST, enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {key}")


def key_of(owner: Any) -> str:
    return agent_keys.create_key("your-jobs", owner=owner)[1]


def error_of(response: Any) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


def test_the_page_asks_for_a_sign_in_first() -> None:
    response = Client(HTTP_HOST=HOST).get(PAGE)
    assert response.status_code == 302
    assert response["Location"] == f"{resolve_url(settings.LOGIN_URL)}?next={PAGE}"
    # A key is for the API, not for the page.
    keyed = with_key(key_of(new_user())).get(PAGE)
    assert keyed.status_code == 302


def test_the_page_holds_the_users_jobs_only_and_its_csrf_token() -> None:
    mine, theirs = new_user(), new_user()
    own, other = job_for(mine), job_for(theirs)
    response = signed_in(mine).get(PAGE)
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    assert str(own.id) in html
    assert str(other.id) not in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert "/static/abp/your_jobs.js" in html
    assert mine.get_username() in html


def test_no_user_is_401_with_a_stable_code() -> None:
    owner = new_user()
    revoked_key, revoked = agent_keys.create_key("revoked", owner=owner)
    key_revocation.revoke(AgentKey.objects.filter(pk=revoked_key.pk))
    inactive = key_of(new_user(active=False))
    service = agent_keys.create_key("service")[1]
    good = key_of(owner)
    clients = [
        Client(HTTP_HOST=HOST),
        with_key(revoked),
        with_key(inactive),
        with_key(service),
        with_key(good[:-1] + ("A" if good[-1] != "A" else "B")),
        Client(HTTP_HOST=HOST, HTTP_AUTHORIZATION=f"Basic {good}"),
    ]
    for client in clients:
        response = client.get(LIST)
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="abp"'
        assert error_of(response)["code"] == "NOT_AUTHENTICATED"
    # Never from the query string.
    from_query = Client(HTTP_HOST=HOST).get(LIST, {"access_token": good})
    assert from_query.status_code == 401


def test_a_key_acts_for_its_owner_with_no_csrf_token(stops: Stops) -> None:
    owner = new_user()
    job = job_for(owner, door=Door.MCP)
    client = with_key(key_of(owner))
    listed = client.get(LIST).json()["jobs"]
    assert [entry["id"] for entry in listed] == [str(job.id)]
    assert listed[0]["door"] == "mcp"
    assert listed[0]["client"] == "abcd1234"
    assert client.get(detail(job.id)).json()["status"] == "running"
    answer = client.post(cancel_url(job.id), {"reason": "from a script"})
    assert answer.status_code == 200
    assert answer.json() == {"id": str(job.id), "cancelled": True, "status": "cancelled"}
    job.refresh_from_db()
    assert (job.cancel_source, job.cancel_reason) == (CancelSource.USER, "from a script")


def test_two_users_never_see_read_or_cancel_each_others_jobs(stops: Stops) -> None:
    alice, bob = new_user(), new_user()
    job = job_for(alice)
    as_bob = [signed_in(bob), with_key(key_of(bob))]
    for client in as_bob:
        assert client.get(LIST).json()["jobs"] == []
        for response in (client.get(detail(job.id)), client.post(cancel_url(job.id))):
            assert response.status_code == 404
            assert error_of(response)["code"] == "NOT_FOUND"
    # The same answer as for an id nobody has.
    nobody = signed_in(bob).get(detail(uuid.uuid4()))
    assert (nobody.status_code, nobody.json()) == (404, signed_in(bob).get(detail(job.id)).json())
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert stops == Stops()
    assert signed_in(alice).get(detail(job.id)).status_code == 200


def test_a_sessions_post_needs_its_csrf_token(stops: Stops) -> None:
    owner = new_user()
    job = job_for(owner)
    client = signed_in(owner, csrf=True)
    refused = client.post(cancel_url(job.id))
    assert refused.status_code == 403
    assert error_of(refused)["code"] == "CSRF_FAILED"
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    html = client.get(PAGE).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    answer = client.post(cancel_url(job.id), HTTP_X_CSRFTOKEN=token.group(1))
    assert answer.status_code == 200
    assert answer.json()["cancelled"] is True
    assert stops.flags == [str(job.id)]


def test_a_settled_job_is_answered_as_it_is(stops: Stops) -> None:
    owner = new_user()
    job = job_for(owner, status=JobStatus.SUCCEEDED, result={"echo": 1})
    answer = signed_in(owner).post(cancel_url(job.id), content_type="application/json")
    assert answer.status_code == 200
    assert answer.json() == {"id": str(job.id), "cancelled": False, "status": "succeeded"}
    assert stops == Stops()


def test_a_reason_must_be_text(stops: Stops) -> None:
    owner = new_user()
    job = job_for(owner)
    client = signed_in(owner)
    for body in ('{"reason": 5}', "not json", '{"reason": "a\\u0000b"}', "[1]"):
        refused = client.post(cancel_url(job.id), body, content_type="application/json")
        assert refused.status_code == 400
        assert error_of(refused)["code"] == "INVALID_PARAMS"
    answer = client.post(
        cancel_url(job.id), '{"reason": "enough"}', content_type="application/json"
    )
    assert answer.json()["cancelled"] is True
    job.refresh_from_db()
    assert job.cancel_reason == "enough"


def test_pages_and_the_status_filter_through_the_api() -> None:
    owner = new_user()
    now = timezone.now()
    made = [job_for(owner, created_at=now - timedelta(seconds=n)) for n in range(5)]
    done = job_for(owner, status=JobStatus.SUCCEEDED, created_at=now - timedelta(minutes=1))
    client = signed_in(owner)
    first = client.get(LIST, {"limit": "2", "status": "running"}).json()
    assert [entry["id"] for entry in first["jobs"]] == [str(job.id) for job in made[:2]]
    assert first["next"].startswith(f"{LIST}?")
    ids = [entry["id"] for entry in first["jobs"]]
    following = first["next"]
    while following:
        page = client.get(following).json()
        ids += [entry["id"] for entry in page["jobs"]]
        following = page["next"]
    assert ids == [str(job.id) for job in made]
    settled = client.get(LIST, {"status": "settled"}).json()["jobs"]
    assert [entry["id"] for entry in settled] == [str(done.id)]
    for query in ({"status": "finished"}, {"limit": "many"}, {"limit": "-1"}, {"cursor": "x"}):
        refused = client.get(LIST, query)
        assert refused.status_code == 400
        assert error_of(refused)["code"] == "INVALID_PARAMS"


def test_a_result_is_its_download_links_and_a_short_summary() -> None:
    owner = new_user()
    job = job_for(owner, status=JobStatus.SUCCEEDED)
    name = default_storage.save(f"results/{job.id}/report.pdf", ContentFile(b"%PDF-1.7 ..."))
    job.result = {
        "pdf": {"$file": name, "mimeType": "application/pdf", "size": 12, "filename": "r.pdf"},
        "html": "<p>" + "x" * 5000 + "</p>",
        "pages": 3,
    }
    job.save()
    failed = job_for(
        owner,
        status=JobStatus.FAILED,
        error_code="OPERATION_FAILED",
        error_message="boom",
        error_traceback="Traceback (most recent call last): secret",
    )
    client = signed_in(owner)
    shown = client.get(detail(job.id)).json()
    (link,) = shown["result"]["files"]
    assert link["name"] == "pdf"
    assert link["filename"] == "r.pdf"
    assert link["downloadUrl"].startswith(f"http://{HOST}/abp/files/")
    assert link["gone"] is False
    assert shown["result"]["summary"] == '{"html": "<5007 characters>", "pages": 3}'
    assert shown["error"] is None
    # A link the download route serves (tests/web/test_downloads.py fetches them).
    token, filename = link["downloadUrl"].split("/")[-2:]
    assert download_links.resolve(token, filename).name == name
    broken = client.get(detail(failed.id))
    assert broken.json()["error"] == {
        "code": "OPERATION_FAILED",
        "message": "boom",
        "retryable": False,
    }
    assert "Traceback" not in broken.content.decode()
    assert '"steps"' not in broken.content.decode()  # the params are never shown


def test_a_result_past_its_retention_has_no_link() -> None:
    owner = new_user()
    long_ago = timezone.now() - timedelta(days=30)
    ref = {"$file": "results/x/old.png", "mimeType": "image/png", "size": 5, "filename": "o.png"}
    job = job_for(owner, status=JobStatus.SUCCEEDED, settled_at=long_ago, result={"image": ref})
    (file,) = signed_in(owner).get(detail(job.id)).json()["result"]["files"]
    assert (file["downloadUrl"], file["gone"]) == (None, True)


def test_the_api_paths_are_never_redirected_and_other_methods_are_405(stops: Stops) -> None:
    owner = new_user()
    job = job_for(owner)
    client = signed_in(owner)
    assert client.get(LIST).status_code == 200
    assert client.get(detail(job.id)).status_code == 200
    wrong = client.get(cancel_url(job.id))
    assert wrong.status_code == 405
    assert wrong["Allow"] == "POST"
    assert error_of(wrong)["code"] == "METHOD_NOT_ALLOWED"
    assert client.post(LIST).status_code == 405
    assert client.post(cancel_url(job.id)).status_code == 200
    assert reverse("abp-your-job-cancel", args=[job.id]) == cancel_url(job.id)
    # No slash to append: a path with one is simply not found.
    assert client.post(cancel_url(job.id) + "/").status_code == 404
    assert Job.objects.get(pk=job.id).status == JobStatus.CANCELLED


def test_an_access_token_for_the_site_acts_for_its_user_and_one_for_mcp_does_not(
    stops: Stops,
) -> None:
    from tests.access.test_oauth_tokens import issued

    owner = new_user()
    job = job_for(owner, door=Door.MCP)
    site = with_key(issued(owner, resource=[f"http://{HOST}/"]))
    assert [entry["id"] for entry in site.get(LIST).json()["jobs"]] == [str(job.id)]
    assert site.post(cancel_url(job.id)).json()["cancelled"] is True
    # A token issued for /mcp is MCP's: not taken here (RFC 8707, no passthrough).
    mcp_only = with_key(issued(owner, resource=[f"http://{HOST}/mcp"]))
    assert mcp_only.get(LIST).status_code == 401
