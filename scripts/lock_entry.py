"""Print one package's entry of a hashed requirements lock read on stdin, hashes and all.

`python scripts/lock_entry.py uv < requirements/dev.txt`: the Makefile installs uv from
the lock's own pin with pip before uv installs the rest.
"""

from __future__ import annotations

import re
import sys


def entry(lock: str, name: str) -> str:
    """The lines of `name==...` and its continuation lines (its hashes)."""
    lines = lock.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"{re.escape(name)}==\S+", line)), None
    )
    if start is None:
        raise SystemExit(f"{name} is not in the lock")
    found = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "\t")):
            break
        if line.strip().startswith("#"):
            continue
        found.append(line)
    return "\n".join(found).rstrip(" \\") + "\n"


if __name__ == "__main__":
    sys.stdout.write(entry(sys.stdin.read(), sys.argv[1]))
