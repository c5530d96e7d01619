"""Test settings: the product's, plus a test-only capability to drive timing.

`test.sleep` is never in the product's manifest: only processes started with
DJANGO_SETTINGS_MODULE=tests.settings (the test stack, the benchmarks) have it.
"""

from abpsite.settings import *  # noqa: F403
from abpsite.settings import ABP

ABP["EXTRA_CAPABILITIES"] = ["tests.support.capabilities.SLEEP"]
