"""The soak stack's Django settings: the test settings, with beat's clean-up every 30 s.

Job rows are kept ABP_JOB_RETENTION_DAYS (a few minutes in the soak, retention.py), so the
bound on the table is reached within a short run; the entry's name is the app's own,
which a host's beat_schedule overrides (capabilities/celery_setup.py).
"""

from tests.settings import *  # noqa: F403
from tests.settings import SMALL_QUEUE
from tests.support.soak.retention import CLEAN_UP_SECONDS

CELERY_BEAT_SCHEDULE = {
    "abp-clean-up": {
        "task": "abp.clean_up",
        "schedule": CLEAN_UP_SECONDS,
        "options": {"queue": SMALL_QUEUE},
    }
}
