"""The local lane: this Daphne's own process pool for small calls (docs/design.md).

Loaded by Daphne (`lane.py`, `pool.py`, `states.py`) and by the lane's processes
(`child.py`); kept light, since a lane process imports this package first.
"""
