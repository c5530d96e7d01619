"""The operators' admin: jobs and sessions (read-only, with cancel) and agent keys."""

import django_stubs_ext

# Lets admin.ModelAdmin[Job] and friends be subscripted at run time, as typed: before
# the admin's modules load, in whichever project installs the app.
django_stubs_ext.monkeypatch()

from capabilities.admin import jobs, keys  # noqa: E402

__all__ = ["jobs", "keys"]
