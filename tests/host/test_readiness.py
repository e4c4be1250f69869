"""/healthz and /readyz as orchestrators use them (D8.18): with the PostgreSQL store cut off (a
TCP relay the test closes), /readyz answers 503 while /healthz still answers 200; once the store
is back, /readyz is 200 again."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import pytest

from .conftest import Server


class Relay:
    """Relays TCP connections to ``target`` until :meth:`cut`, which closes every connection and
    refuses new ones until :meth:`restore`."""

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.sockets.clear()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _until(server: Server, path: str, status: int) -> None:
    for _ in range(600):
        if server.client.get(path).status_code == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never answered {status}")


@pytest.mark.postgres
def test_readyz_follows_the_store_and_healthz_the_process(
    host_factory: Callable[..., Server], pg_schemas: object
) -> None:
    """Store cut: /readyz 503 (a problem document, no detail of the error), /healthz 200; store
    back: /readyz 200."""
    url = pg_schemas.url()  # type: ignore[attr-defined]
    parts = urlsplit(url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    relayed = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{relay.port}"))
    try:
        server = host_factory("--db", relayed)
        assert server.client.get("/readyz").json() == {"status": "ready"}
        relay.cut()
        _until(server, "/readyz", 503)
        cut = server.client.get("/readyz")
        assert cut.headers["content-type"] == "application/problem+json"
        assert cut.json()["detail"] == "the store is not reachable"
        assert server.client.get("/healthz").status_code == 200
        relay.restore()
        _until(server, "/readyz", 200)
    finally:
        relay.close()
