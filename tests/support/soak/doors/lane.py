"""What every door's lane is given: the ledger, its own random draws, the mix, the stop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass

from tests.support.soak import plan
from tests.support.soak.ledger import Ledger


@dataclass(frozen=True)
class Lane:
    """One lane's context."""

    ledger: Ledger
    rng: random.Random
    mix: plan.Mix
    stop: asyncio.Event

    async def pause(self, mean: float) -> None:
        """A random pause (exponential, mean `mean` s), cut short by the stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), self.rng.expovariate(1 / mean))
