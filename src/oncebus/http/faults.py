"""``/$faults``: arm, list and disarm faults over HTTP, so test suites in any language can use them.

::

    POST   /$faults          {"kind": "lost-ack", "entity": "orders", "after": 2}   -> 201 the armed fault
    GET    /$faults                                                                  -> 200 [armed faults]
    DELETE /$faults                                                                  -> 200 {"cleared": n}
    DELETE /$faults/{id}                                                             -> 200 {"cleared": 1}

Every request needs a key with the Manage right, for the whole namespace: ``Authorization:
SharedAccessSignature sr=<namespace URL>&...`` (as the SDKs sign them) or HTTP Basic (user: the key name,
password: the key). A broker serving beyond loopback refuses to arm (403) unless started with
``--allow-faults``. Bodies and answers are JSON; the fields are those of ``oncebus.broker.FaultSpec``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from oncebus.auth import MANAGE, KeyRing, authorize_request, refusal_text
from oncebus.broker import FaultsDisabledError, FaultSpec, Observation
from oncebus.core.errors import OncebusError, UnauthorizedError, status_of
from oncebus.http.jsonbody import parse_json
from oncebus.http.server import Receive, Scope, Send

PREFIX = "/$faults"
MAX_BODY = 64 * 1024


def is_faults_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class FaultsApi:
    """An ASGI application serving ``/$faults`` for one namespace's fault book."""

    def __init__(
        self, namespace: Observation, keys: Mapping[str, str], *, wall_time: Callable[[], float] = time.time
    ) -> None:
        self.namespace = namespace
        self.keys = KeyRing.of(keys)
        self.wall_time = wall_time

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                await _json(send, 413, {"error": f"the request body is over {MAX_BODY} bytes"})
                return
            if not message.get("more_body", False):
                break
        try:
            status, answer = self._handle(scope, bytes(body))
        except OncebusError as exc:
            text = str(exc)
            if isinstance(exc, UnauthorizedError) and not isinstance(exc, FaultsDisabledError):
                text = refusal_text(exc)
            status, answer = status_of(exc), {"error": text}
        await _json(send, status, answer)

    def _handle(self, scope: Scope, body: bytes) -> tuple[int, Any]:
        self._authorize(scope)
        path, method = str(scope["path"]), str(scope["method"]).upper()
        book = self.namespace.faults
        fault_id = path[len(PREFIX) + 1 :] or None
        if fault_id is None and method == "GET":
            return 200, [fault.to_dict() for fault in book.list()]
        if fault_id is None and method == "POST":
            spec = parse_json(body or b"{}", "the body", "a JSON object: a fault's kind, entity and settings")
            return 201, book.arm(FaultSpec.from_dict(spec)).to_dict()
        if method == "DELETE":
            if fault_id is not None and fault_id not in {fault.fault_id for fault in book.list()}:
                return 404, {"error": f"no fault {fault_id!r} is armed"}
            return 200, {"cleared": book.clear(fault_id)}
        allowed = "DELETE" if fault_id is not None else "GET, POST, DELETE"
        return 405, {"error": f"method {method} is not allowed on {path}; allowed: {allowed}"}

    def _authorize(self, scope: Scope) -> None:
        """A key with the Manage right for the whole namespace: a SAS token for its root, or HTTP Basic."""
        authorize_root_manage(
            scope,
            self.keys,
            self.wall_time(),
            shown=PREFIX,
            missing="arming faults needs a key with the Manage right: Authorization: SharedAccessSignature ... (for "
            "the namespace) or HTTP Basic (user: the key name, password: the key)",
        )


async def _json(send: Send, status: int, answer: Any) -> None:
    body = json.dumps(answer).encode() + b"\n"
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def authorize_root_manage(scope: Scope, keys: KeyRing, now: float, *, shown: str, missing: str) -> None:
    """Raise ``UnauthorizedError`` unless the request carries a key of ``keys`` with the Manage right on the
    namespace's root (a SAS token for the namespace, or HTTP Basic): what ``/$faults`` and ``/$namespaces`` ask."""
    headers = {bytes(k).lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
    authorize_request(
        headers.get(b"authorization"),
        keys,
        "",
        MANAGE,
        host=headers.get(b"host"),
        now=now,
        shown=shown,
        missing=missing,
        basic=True,
    )
