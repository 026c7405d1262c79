"""Running the server: bind the socket (so the port is known and a busy port is one clear
error), serve with uvicorn, and stop cleanly.

Ctrl-C or SIGTERM: the worker stops the running generation after its current step and
fails the queued requests with 503; uvicorn stops accepting, lets the open responses end,
and returns; the worker thread finishes recording the history before `run` returns, so the
command exits 0. A second Ctrl-C stops waiting for open connections."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading
from pathlib import Path

import uvicorn

from specgen.app.session import Session
from specgen.errors import ConfigError
from specgen.serve.app import create_app
from specgen.serve.common import ServedModel
from specgen.serve.metrics import Metrics
from specgen.serve.worker import Worker

SHUTDOWN_GRACE_SECONDS = 10  # for responses to finish once generation has stopped


def check_options(port: int, max_queue: int) -> None:
    """Refuse bad numbers before any model loads."""
    if max_queue < 0:
        raise ConfigError(f"--max-queue must be 0 or more, got {max_queue}.")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be from 0 to 65535, got {port}.")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, with signals that stop the worker too and are not raised again
    after shutdown (uvicorn re-raises them, which would end the process with 130 or 143)."""

    def __init__(self, config: uvicorn.Config, on_exit) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = [signal.SIGINT, signal.SIGTERM]
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Server:
    """The loaded session behind the HTTP APIs. `bind()`, then `run()` (blocks until stopped
    by a signal or by `stop()` from another thread)."""

    def __init__(self, session: Session, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, max_queue: int = 16, stats_db: Path | None = None,
                 record_prompt: bool = False) -> None:
        check_options(port, max_queue)
        self.host, self.port = host, port
        self.metrics = Metrics()
        self.worker = Worker(session, max_queue, stats_db, record_prompt, self.metrics)
        self.served = ServedModel.of(session, self.worker.context_limit)
        self.app = create_app(self.worker, self.served, api_key)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS)
        self._server = _Uvicorn(config, on_exit=self.worker.shutdown)
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def bind(self) -> None:
        """Open the listening socket (port 0: any free port, then `port` tells which)."""
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
            # proto must say TCP: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
            # sockets that do, and with it on every small streamed chunk waits for an ACK.
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
                sock.listen(128)
            except OSError:
                sock.close()
                raise
        except socket.gaierror:
            raise ConfigError(f"--host {self.host!r} is not an address or a name this machine "
                              "can resolve.") from None
        except OSError as e:
            raise ConfigError(f"Cannot listen on {self.host}:{self.port}: {e.strerror}. Pick "
                              "another --port (or stop what holds this one).") from None
        self._socket = sock
        self.port = sock.getsockname()[1]

    def run(self) -> None:
        if self._socket is None:
            self.bind()
        self.worker.start()
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self.worker.shutdown()
            self.worker.join()
            self._socket.close()

    def stop(self) -> None:
        """What Ctrl-C does, from any thread."""
        self.worker.shutdown()
        self._server.should_exit = True

    @property
    def started(self) -> bool:
        return self._server.started
