"""Test settings: the product's, plus test-only capabilities (timing, memory).

`test.sleep` and `test.allocate` are never in the product's manifest: only processes
started with DJANGO_SETTINGS_MODULE=tests.settings (the test stack, the benchmarks)
have them.
"""

from abpsite.settings import *  # noqa: F403
from abpsite.settings import ABP

ABP["EXTRA_CAPABILITIES"] = [
    "tests.support.capabilities.SLEEP",
    "tests.support.capabilities.ALLOCATE",
]
