"""The jobs changelist by user: a filter by user (or none), a search by username, and
each job's user and client shown."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.support.admin_clients import client_for
from tests.support.user_jobs import job_for, new_user

pytestmark = pytest.mark.usefixtures("database")

CHANGELIST = reverse("admin:capabilities_job_changelist")


@pytest.fixture
def staff() -> Client:
    return client_for(staff=True)


def test_the_user_filter_offers_the_users_of_recent_jobs_and_narrows_to_one(staff: Client) -> None:
    alice, bob = new_user(), new_user()
    alices, bobs, nobodys = job_for(alice), job_for(bob, client="feedbeef"), job_for(None)
    page = staff.get(CHANGELIST).content.decode()
    for user in (alice, bob):
        assert f"?user={user.pk}" in page
        assert user.get_username() in page
    assert "?user=none" in page
    assert "feedbeef" in page  # the client column
    only_bob = staff.get(CHANGELIST, {"user": bob.pk}).content.decode()
    assert bobs.call_id in only_bob
    assert alices.call_id not in only_bob
    nobody = staff.get(CHANGELIST, {"user": "none"}).content.decode()
    assert nobodys.call_id in nobody
    assert alices.call_id not in nobody


def test_a_user_with_no_recent_job_can_still_be_chosen(staff: Client) -> None:
    quiet = new_user()
    page = staff.get(CHANGELIST, {"user": quiet.pk})
    assert page.status_code == 200
    assert quiet.get_username() in page.content.decode()


def test_search_by_username_and_the_change_page_shows_user_and_client(staff: Client) -> None:
    alice = new_user()
    mine, other = job_for(alice, client="c0ffee00"), job_for(new_user())
    found = staff.get(CHANGELIST, {"q": alice.get_username()}).content.decode()
    assert mine.call_id in found
    assert other.call_id not in found
    detail = staff.get(reverse("admin:capabilities_job_change", args=[mine.pk])).content.decode()
    assert "c0ffee00" in detail
    assert alice.get_username() in detail
