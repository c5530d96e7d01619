"""Worker -> consumer note latency of both channels_redis layers, in one run.

A sender layer (as in a worker) group_sends small notes; a receiver layer (as in
Daphne) has a channel in that group and awaits them. Prints p50/p99 per layer.

Run: .venv/bin/python bench/channel_layers.py [--messages 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import environment

STACK = environment.prepare("abp-bench-layers-")

from channels_redis.core import RedisChannelLayer  # noqa: E402
from channels_redis.pubsub import RedisPubSubChannelLayer  # noqa: E402
from django.conf import settings  # noqa: E402

from bench import stats  # noqa: E402
from tests.support.stack import port_open  # noqa: E402


async def measure(layer_class: Any, messages: int) -> list[float]:
    hosts = [settings.REDIS_URL]
    sender, receiver = layer_class(hosts=hosts), layer_class(hosts=hosts)
    channel = await receiver.new_channel()
    await receiver.group_add("bench.group", channel)
    latencies = []
    for n in range(messages + 50):
        start = time.perf_counter()
        await sender.group_send("bench.group", {"type": "job.settled", "call_id": str(n)})
        await receiver.receive(channel)
        if n >= 50:  # the first ones warm connections up
            latencies.append((time.perf_counter() - start) * 1000)
    await receiver.group_discard("bench.group", channel)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    try:
        STACK.redis.start(lambda: port_open(STACK.redis_port))
        core = asyncio.run(measure(RedisChannelLayer, args.messages))
        pubsub = asyncio.run(measure(RedisPubSubChannelLayer, args.messages))
    finally:
        STACK.redis.stop()
        STACK.remove_files()
    pubsub_p50 = stats.summary(pubsub)["p50"]
    print("\n== group_send -> receive, one small note at a time")
    print(stats.line("RedisPubSubChannelLayer (channels_redis.pubsub)", pubsub))
    print(stats.line("RedisChannelLayer (channels_redis.core)", core, pubsub_p50))


if __name__ == "__main__":
    main()
