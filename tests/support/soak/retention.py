"""How long the soak keeps job rows, and how often beat's clean-up removes them.

Short enough that a few minutes of load reach the table's bound; the retention is still
longer than a session's resume grace (120 s, fleet.SETTINGS), so no result waiting for
its agent loses its row to the clean-up.
"""

RETENTION_SECONDS = 150.0
CLEAN_UP_SECONDS = 30.0
# The longest a settled row may stay: its retention, then the next clean-up pass, which
# may wait behind the small queue or a beat being restarted.
ROW_BOUND_SECONDS = RETENTION_SECONDS + CLEAN_UP_SECONDS + 60.0
