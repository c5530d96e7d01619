"""The production-like stack of the soak: a private PostgreSQL cluster, the deployment's
processes (tests/support/topology.py), HAProxy in front of the Daphnes as deploy/
haproxy.cfg has it, and a relay on the Daphnes' path to Redis that can stall or refuse.
"""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

from tests.support import fleet
from tests.support.postgres_server import PostgresServer
from tests.support.soak.doors import browser
from tests.support.soak.relay import RedisRelay
from tests.support.soak.retention import RETENTION_SECONDS
from tests.support.stack import free_port, port_open
from tests.support.topology import Process, Topology, local_proxy_config

SETTINGS = {
    **fleet.SETTINGS,
    "DJANGO_SETTINGS_MODULE": "tests.support.soak.settings",
    "ABP_JOB_RETENTION_DAYS": repr(RETENTION_SECONDS / 86400),
    # The browser door's page: its principal's limits as high as the agents' (fleet.py).
    "ABP_PAGE_TOKEN_CALLS_PER_MINUTE": "10000000",
    "ABP_PAGE_TOKEN_MAX_CONCURRENT_CALLS": "1000",
}


class SoakStack:
    """Everything the soak runs against, started and stopped as one."""

    def __init__(self, run_dir: Path, *, heavy_concurrency: int = 2) -> None:
        self.run_dir = run_dir
        self.heavy_concurrency = heavy_concurrency
        self.postgres = PostgresServer()
        # The origin of the page that embeds the app (doors/browser.py serves it), bound
        # now: a port only chosen now could be any client socket's by the time the
        # browser lane binds it (an OSError 98 that crashed the lane).
        self.parent_site = browser.parent_server()
        self.parent_port = self.parent_site.server_address[1]
        settings = {**SETTINGS, "ABP_EMBED_ALLOWED_ORIGINS": f"http://127.0.0.1:{self.parent_port}"}
        self.topology = Topology(
            "soak", run_dir, settings, heavy_concurrency=heavy_concurrency,
            database_server=self.postgres.url,
        )  # fmt: skip
        # The Daphnes reach Redis (channel layer, abort flags, broker) through the relay.
        self.relay = RedisRelay(self.topology.redis_port)
        for web in self.topology.webs:
            web.process.env["REDIS_URL"] = f"redis://127.0.0.1:{self.relay.port}/0"
        self.proxy_port = free_port()
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        config = run_dir / "haproxy.cfg"
        config.write_text(local_proxy_config(self.proxy_port, [w.port for w in self.topology.webs]))
        self.proxy = Process(
            "haproxy", [haproxy, "-db", "-f", str(config)], self.topology.env, run_dir
        )
        self.key = ""

    @property
    def http_url(self) -> str:
        """The proxy's root."""
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def ws_url(self) -> str:
        """ABP's WebSocket, through the proxy."""
        return f"ws://127.0.0.1:{self.proxy_port}/abp/ws"

    def start(self) -> None:
        """PostgreSQL, then the topology, then the proxy, until it sees every Daphne up."""
        self.postgres.init()
        self.postgres.start()
        self.topology.start()
        self.proxy.launch()
        self.proxy.wait_ready(lambda: port_open(self.proxy_port))
        self.key = self.topology.create_key("soak")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self._proxied():
            time.sleep(0.5)

    def _proxied(self) -> bool:
        """Both Daphnes serve through the proxy (its checks have seen them up)."""
        for _ in range(4):
            try:
                with urllib.request.urlopen(f"{self.http_url}/readyz?exclude=workers", timeout=5):
                    pass
            except OSError:
                return False
        return True

    def stop(self) -> None:
        """Everything, in the reverse order; the cluster's files are removed."""
        self.proxy.stop()
        try:
            if self.postgres.pid() is None:  # a fault left it down: the database is dropped
                self.postgres.start()
            self.topology.stop()
        finally:
            self.relay.close()
            self.parent_site.server_close()
            self.postgres.remove()

    def keep_logs(self, artifacts: Path) -> None:
        """Every process's log, the proxy's and PostgreSQL's, into `artifacts`."""
        self.topology.keep_logs(artifacts)
        for path in (self.proxy.log_path, self.postgres.log_path):
            if path.exists():
                shutil.copyfile(path, artifacts / path.name)
