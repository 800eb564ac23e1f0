"""The ``$cbs`` node (claims-based security): ``put-token`` requests judged against the namespace's keys.

The SDK sends ``operation=put-token``, ``type`` (``servicebus.windows.net:sastoken``
or ``jwt``), ``name`` (the audience, ``sb://host/<entity>``) and the token as
the body; it reads ``status-code`` / ``status-description`` from the reply.
Only shared access signatures are accepted: oncebus has no identity provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncebus.amqp.sas import Grant, authorize
from oncebus.amqp.values import string_or_binary as _text
from oncebus.auth import check_host, refusal_text, token_namespace
from oncebus.core.errors import UnauthorizedError

CBS_NODE = "$cbs"


@dataclass(frozen=True)
class PutTokenResult:
    status_code: int
    status_description: str
    grant: Grant | None


def put_token(
    application_properties: Mapping[str, Any] | None,
    body: Any,
    keys: Mapping[str, str],
    now: float,
    host: str | None = None,
    namespace: str | None = None,
) -> PutTokenResult:
    """Judge one CBS request; a granted token comes back as ``grant`` (status 202, as Service Bus answers).

    ``host``: the hostname the client named in its ``open`` (a token for another host is refused).
    """
    props = dict(application_properties or {})
    operation = _text(props.get("operation"))
    if operation != "put-token":
        return PutTokenResult(400, f"unsupported $cbs operation {operation!r}; only put-token is", None)
    audience = _text(props.get("name"))
    if not audience:
        return PutTokenResult(400, "put-token needs the audience in application property 'name'", None)
    token = _text(body)
    if token is None:
        return PutTokenResult(400, "put-token needs the token as a string body", None)
    try:
        grant = authorize(token, audience, keys, now, namespace)
        check_host(grant, host)
    except UnauthorizedError as exc:
        return PutTokenResult(401, refusal_text(exc), None)
    return PutTokenResult(202, "Accepted", grant)


def request_namespace(body: Any, keys: Mapping[str, str] | None = None) -> str | None:
    """The namespace a put-token request's token names by its key name (``key@name``); None: the default one."""
    return token_namespace(_text(body), keys)
