"""Notes sent off a running loop (an `async def` capability's reports): no loop is kept.

Each thread that sends notes has an event loop of its own, and channels_redis a layer
(with its Redis connections) per loop; a thread made for one report must close its
loop when it ends, or every report of an async capability would leave both behind.
"""

from __future__ import annotations

import asyncio
import threading

from capabilities.jobs import notes
from capabilities.worker import executor


def test_a_threads_notes_loop_is_closed_with_it() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    def send_a_note() -> None:
        loops.append(notes._loop())  # as notify_group takes it

    executor._off_the_loop(send_a_note)
    assert len(loops) == 1
    assert loops[0].is_closed()


def test_closing_a_thread_without_a_loop_is_a_no_op_and_a_new_loop_comes_next() -> None:
    found: list[bool] = []

    def run() -> None:
        notes.close_thread_loop()
        first = notes._loop()
        notes.close_thread_loop()
        found.append(first.is_closed())
        found.append(not notes._loop().is_closed())
        notes.close_thread_loop()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert found == [True, True]
