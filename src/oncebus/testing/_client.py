"""A blocking client of a running broker's control socket (``oncebus.server.control``'s JSON lines)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from oncebus.core.errors import OncebusError
from oncebus.server.control import error_from_json


class BrokerGoneError(OncebusError, RuntimeError):
    """The broker under test stopped answering (it crashed or was stopped); the message carries its output."""

    condition = "amqp:internal-error"
    status = 500


class ControlClient:
    """One connection, reused; thread-safe (one request at a time)."""

    def __init__(self, port: int, token: str, *, describe_failure: Callable[[], str] = lambda: "") -> None:
        self.port = port
        self.token = token
        self._describe_failure = describe_failure
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._file: Any = None

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        request = json.dumps({"token": self.token, "op": op, "args": args or {}}, default=str).encode() + b"\n"
        with self._lock:
            try:
                if self._file is None:
                    self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
                    self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._file = self._sock.makefile("rwb")
                self._file.write(request)
                self._file.flush()
                line = self._file.readline()
                if not line:
                    raise ConnectionError("the broker closed the control connection")
            except OSError as exc:
                self._close_locked()
                raise BrokerGoneError(
                    f"the oncebus broker (control port {self.port}) does not answer: {exc}" + self._describe_failure()
                ) from exc
        reply = json.loads(line)
        if not reply.get("ok"):
            raise error_from_json(reply)
        return reply.get("result")

    def _close_locked(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._file = self._sock = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()
