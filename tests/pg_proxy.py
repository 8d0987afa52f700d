"""A small TCP proxy in front of the test cluster, to cut or stall a connection.

Listens on 127.0.0.1 (a free port) and forwards every connection to the
cluster's unix socket. ``pause`` stops forwarding in both directions (a
network partition: nothing is refused, nothing arrives); ``resume`` lets the
held bytes through. ``cut_after(marker)`` drops the next connection that
sends ``marker`` right after forwarding it: the server still receives and
completes the statement, the client never hears back (a lost acknowledgement).
With ``late=S`` the statement reaches the server only S seconds after the
client lost the connection (it was still on the way when the cut came).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tests.pg import PgCluster

_CHUNK = 65536


class Proxy:
    def __init__(self, upstream: Path) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._running = threading.Event()
        self._running.set()
        self._closed = False
        self._marker: bytes | None = None
        self._late = 0.0
        self.cuts = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, pg_url: str) -> str:
        """``pg_url``'s database, reached through this proxy."""
        dbname = urlsplit(pg_url).path.lstrip("/")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def cut_after(self, marker: bytes, late: float = 0.0) -> None:
        with self._lock:
            self._marker, self._late = marker, late

    def close(self) -> None:
        self._closed = True
        self._running.set()
        self._listener.close()
        with self._lock:
            for pair in self._pairs:
                for sock in pair:
                    with contextlib.suppress(OSError):
                        sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(str(self.upstream))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(client, selectors.EVENT_READ, server)
            sel.register(server, selectors.EVENT_READ, client)
            while not self._closed:
                if not self._running.wait(0.05):
                    continue  # paused: leave the bytes where they are
                for key, _ in sel.select(0.05):
                    if not self._forward(key.fileobj, key.data, client, server):  # type: ignore[arg-type]
                        self._drop(client, server)
                        return

    def _forward(
        self, src: socket.socket, dst: socket.socket, client: socket.socket, server: socket.socket
    ) -> bool:
        try:
            data = src.recv(_CHUNK)
        except OSError:
            return False
        if not data:
            return False
        late = self._take_marker(data) if src is client else None
        if late:
            client.close()  # lost before the statement reached the server
            time.sleep(late)
        with contextlib.suppress(OSError):
            dst.sendall(data)
        if late is not None:
            # The server got the statement: wait for its answer, then lose it.
            client.close()
            with contextlib.suppress(OSError):
                server.settimeout(10)
                server.recv(_CHUNK)
            return False
        return True

    def _take_marker(self, data: bytes) -> float | None:
        """None: no cut here; else the seconds the statement is held back."""
        with self._lock:
            if self._marker is None or self._marker not in data:
                return None
            self._marker = None
            self.cuts += 1
            return self._late

    def _drop(self, client: socket.socket, server: socket.socket) -> None:
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def proxy_for(cluster: PgCluster) -> Iterator[Proxy]:
    proxy = Proxy(cluster.socket_dir / ".s.PGSQL.5432")
    try:
        yield proxy
    finally:
        proxy.close()
