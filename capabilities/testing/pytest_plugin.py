"""pytest plugin: `abp_stack`, one LiveStack for the whole test session.

Enabled by a line in the host project's `conftest.py`:
`pytest_plugins = ["capabilities.testing.pytest_plugin"]`. The stack starts when a
test first asks for `abp_stack`, for the settings DJANGO_SETTINGS_MODULE names
(pytest-django's `--ds` or `DJANGO_SETTINGS_MODULE` ini option sets it), and stops when
the session ends; its database, files and logs stay in pytest's temporary folder
(`abp-stack0`). For other arguments (a Celery app elsewhere, PostgreSQL), define a
fixture of the same name in `conftest.py` around `LiveStack(...)`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from capabilities.testing.live import LiveStack


@pytest.fixture(scope="session")
def abp_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """The host project's real stack: `url`, `http_url`, `key`, `call(...)`, `start(...)`."""
    with LiveStack(run_dir=tmp_path_factory.mktemp("abp-stack")) as stack:
        yield stack
