"""Test settings: the product's, plus apps of test-only capabilities.

`tests.testapp` declares `test.sleep` and `test.allocate` (timing, memory), and
`tests.reports` is the tutorial's app (docs/your-capabilities.md). They are never in
the product's manifest: only processes started with DJANGO_SETTINGS_MODULE=tests.settings
(the test stack, the benchmarks) have them.
"""

from abpsite.settings import *  # noqa: F403
from abpsite.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "tests.reports", "tests.notes"]

# CIMD documents from tests/testapp/cimd_documents.py: the real fetcher refuses loopback.
OAUTH2_PROVIDER = {
    **OAUTH2_PROVIDER,  # noqa: F405
    "CIMD_METADATA_FETCHER": "tests.testapp.cimd_documents.FixtureFetcher",
}
