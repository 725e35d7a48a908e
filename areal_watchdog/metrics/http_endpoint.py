"""The sidecar's ``/metrics`` over HTTP: ``prometheus_client``'s own server, bound to
``watchdog.metrics.host`` (127.0.0.1 unless told otherwise: docs/security.md) on the port the
launcher chose, or on a free one where that port is taken or none was chosen."""

from __future__ import annotations

from typing import Any


class HttpEndpoint:
    """A running endpoint; ``port`` is where it listens."""

    def __init__(self, registry: Any, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=registry)
        except OSError:
            if port == 0:
                raise
            self.server, self.thread = start_http_server(0, addr=host, registry=registry)
        self.host, self.port = host, int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
