"""How calls and sessions end from outside their connection, in Daphne and the worker.

A cancel (`cancellation`: settle, then stop the work), a lost worker, a withdrawn key
or user (`access_withdrawal`, `key_revocation`, `user_deactivation`), a session never
resumed (`resumption`). Loaded by Daphne and by the worker's reaper alike.
"""
