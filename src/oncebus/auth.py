"""Shared access signatures: the keys of the namespace and the verification of tokens (CBS and HTTP).

A token is ``SharedAccessSignature sr=<url-encoded resource>&sig=<signature>&se=<expiry>&skn=<key name>``
where the signature is the base64 of HMAC-SHA256, keyed with the named key, over
``<url-encoded resource>\\n<expiry>`` (the resource exactly as it appears in the token).
A token grants access to its resource and everything below it, until its
expiry. oncebus has one namespace, so the host part of the resource is not
compared, only its path: a token for ``sb://anything/orders`` covers the queue
``orders`` and its sub-queues and ``$management`` node; a token for
``sb://anything/`` covers the whole namespace.

The local default key is the one the official Service Bus emulator documents
(``RootManageSharedAccessKey`` = ``SAS_KEY_VALUE``), so connection strings
written for the emulator work unchanged. Configure other keys for anything
reachable from other machines.

The same verification serves AMQP's CBS ``put-token`` and the administration
API's ``Authorization: SharedAccessSignature ...`` header (``oncebus.amqp.sas``
re-exports this module).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote_plus, unquote, unquote_plus, urlencode, urlsplit

from oncebus.core.errors import UnauthorizedError

DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_KEY = "SAS_KEY_VALUE"
DEFAULT_KEYS: Mapping[str, str] = {DEFAULT_KEY_NAME: DEFAULT_KEY}

TOKEN_PREFIX = "SharedAccessSignature "


@dataclass(frozen=True)
class Grant:
    """What a verified token allows: the entity path prefix it covers, until when (epoch seconds)."""

    resource_path: str
    expires_at: float
    key_name: str

    def covers(self, entity_path: str, now: float) -> bool:
        return now < self.expires_at and path_covers(self.resource_path, normalize_path(entity_path))


def parse_keys(text: str) -> dict[str, str]:
    """``name=key[,name=key...]`` (as given on the command line or in ONCEBUS_SAS_KEYS) to a mapping."""
    keys: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, key = item.partition("=")
        if not sep or not name.strip() or not key:
            raise ValueError(f"SAS key {item!r} is not of the form name=key")
        keys[name.strip()] = key
    if not keys:
        raise ValueError("no SAS key given; use name=key[,name=key...]")
    return keys


def normalize_path(path: str) -> str:
    """Entity paths compare case-insensitively, without surrounding slashes."""
    return path.strip("/").lower()


def resource_path(uri: str) -> str:
    """The path part of a resource URI (``sb://host:port/orders`` -> ``orders``); a bare path is kept."""
    if "://" in uri:
        return normalize_path(urlsplit(uri).path)
    return normalize_path(uri)


def path_covers(scope: str, entity_path: str) -> bool:
    """True when ``scope`` is ``entity_path`` or one of its ancestors, on a segment boundary."""
    if scope == "":
        return True
    return entity_path == scope or entity_path.startswith(scope + "/")


def sign(encoded_resource: str, expiry: int, key: str) -> str:
    digest = hmac.new(key.encode("utf-8"), f"{encoded_resource}\n{expiry}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def make_token(resource_uri: str, key_name: str, key: str, expiry: int) -> str:
    """A token as the Service Bus SDKs build it (used by tests and tools)."""
    signature = sign(quote_plus(resource_uri), expiry, key)
    return TOKEN_PREFIX + urlencode({"sr": resource_uri, "sig": signature, "se": str(expiry), "skn": key_name})


def verify_token(token: str, keys: Mapping[str, str], now: float | None = None) -> Grant:
    """Check a SAS token's form, key, signature and expiry; raise :class:`UnauthorizedError` if any fails."""
    if now is None:
        now = time.time()
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        raise UnauthorizedError("the token is not a shared access signature (SharedAccessSignature sr=...&sig=...)")
    fields: dict[str, str] = {}
    for part in token[len(TOKEN_PREFIX) :].split("&"):
        name, sep, value = part.partition("=")
        if not sep or name in fields:
            raise UnauthorizedError(f"malformed shared access signature field {part!r}")
        fields[name] = value
    missing = [name for name in ("sr", "sig", "se", "skn") if not fields.get(name)]
    if missing:
        raise UnauthorizedError(f"the shared access signature lacks {', '.join(missing)}")
    key_name = unquote_plus(fields["skn"])
    key = keys.get(key_name)
    if key is None:
        raise UnauthorizedError(f"unknown shared access key name {key_name!r}")
    try:
        expiry = int(fields["se"])
    except ValueError:
        raise UnauthorizedError(f"the expiry se={fields['se']!r} is not a whole number of seconds") from None
    expected = sign(fields["sr"], expiry, key)
    if not hmac.compare_digest(expected.encode(), unquote(fields["sig"]).encode()):
        raise UnauthorizedError(f"the signature does not match key {key_name!r}")
    if expiry <= now:
        raise UnauthorizedError(f"the token expired at {expiry} (now {int(now)})")
    return Grant(resource_path(unquote_plus(fields["sr"])), float(expiry), key_name)


def authorize(token: str, audience: str, keys: Mapping[str, str], now: float | None = None) -> Grant:
    """Verify ``token`` and check that it covers ``audience`` (the CBS request's ``name``)."""
    grant = verify_token(token, keys, now)
    wanted = resource_path(audience)
    if not path_covers(grant.resource_path, wanted):
        raise UnauthorizedError(f"the token for {grant.resource_path or '/'!r} does not cover {wanted or '/'!r}")
    # the client asked for this audience: that is what the token now grants on this connection
    return dataclasses.replace(grant, resource_path=wanted)


def connection_string(host: str, port: int, key_name: str = DEFAULT_KEY_NAME, key: str = DEFAULT_KEY) -> str:
    """The connection string for the SDKs (plain AMQP on ``host:port``)."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key_name};SharedAccessKey={key};UseDevelopmentEmulator=true"
    )
