"""Shared access signatures: the keys of the namespace, their rights, and the verification of tokens (CBS and HTTP).

A token is ``SharedAccessSignature sr=<url-encoded resource>&sig=<signature>&se=<expiry>&skn=<key name>``
where the signature is the base64 of HMAC-SHA256, keyed with the named key, over
``<url-encoded resource>\\n<expiry>`` (the resource exactly as it appears in the token).

As in Azure, a token grants what its key's rights allow (``Send``, ``Listen``, ``Manage``; Manage implies
the other two) on the resource its audience names and everything below it, until its expiry. The resource
is compared without its scheme and port, case-insensitively and URL-decoded, against the node or URL the
client actually uses: a token for ``sb://host/orders`` covers the queue ``orders``, its sub-queues and its
``$management`` node; one for ``sb://host/orders/$management`` covers that node only; one for
``https://host/$Resources/Queues`` covers listing the queues; one for ``sb://host/`` the whole namespace.
Never a sibling (``orders`` does not cover ``orders2``). When the client names the host it talks to (the
AMQP ``open``'s hostname, the HTTP ``Host`` header), a token made for another host is refused, as Azure
refuses a token for another namespace.

A token signed with an entity's own shared access rule (a queue's or a topic's ``authorization_rules``) is
bound to that entity besides: it grants on the entity, its sub-queues, its subscriptions with their rules and
its ``$management`` node, and on no other entity, even one whose name starts with it (a rule of the queue
``a`` does not reach the queue ``a/b``, whose name merely begins with ``a/``, while a namespace key's token
for ``sb://host/a`` does). :func:`entity_of_path` tells which entity a path belongs to.

Every door asks :func:`access_denied`, one check: AMQP links and ``$management`` requests with the tokens a
connection has put on ``$cbs``, CBS itself for the audience a token is put for, and every HTTP request (REST
messages, the administration API, ``/$faults``, ``/$namespaces``, the dashboard and ``/metrics``) through
:func:`authorize_request` with the token or HTTP Basic key its ``Authorization`` header carries.

Keys are given as ``NAME=KEY`` (all rights) or ``NAME:RIGHTS=KEY`` (``RIGHTS`` a comma-separated list of
Send, Listen, Manage): on the command line (``--key``), one per line in a keys file (``--keys-file``), or
separated by ``;`` or newlines in the ``ONCEBUS_SAS_KEYS`` environment variable. A key name holds neither
``=`` nor ``:`` (Azure allows letters, digits, ``.``, ``-`` and ``_``), so the form is unambiguous whatever
the key holds.

The local default key is the one the official Service Bus emulator documents
(``RootManageSharedAccessKey`` = ``SAS_KEY_VALUE``), so connection strings
written for the emulator work unchanged. It is public: ``oncebus serve`` refuses
to listen beyond loopback with it unless told to.

The same verification serves AMQP's CBS ``put-token`` and the administration
API's ``Authorization: SharedAccessSignature ...`` header (``oncebus.amqp.sas``
re-exports this module).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import ipaddress
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote_plus, unquote, unquote_plus, urlencode, urlsplit

from oncebus.core.entities import entity_of_path
from oncebus.core.errors import UnauthorizedError

DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_KEY = "SAS_KEY_VALUE"
DEFAULT_KEYS: Mapping[str, str] = {DEFAULT_KEY_NAME: DEFAULT_KEY}
KEYS_ENV = "ONCEBUS_SAS_KEYS"

TOKEN_PREFIX = "SharedAccessSignature "
NAMESPACE_SEPARATOR = "@"  # key name "<key>@<namespace>": a namespace created at run time (server/namespaces.py)

SEND, LISTEN, MANAGE = "Send", "Listen", "Manage"
RIGHTS = (MANAGE, SEND, LISTEN)
ALL_RIGHTS: frozenset[str] = frozenset(RIGHTS)
MAX_EXPIRY = 253_402_300_799  # 9999-12-31T23:59:59Z: a later se is refused, not overflowed
_SE = re.compile(r"[0-9]{1,20}")
_KEY_NAME = re.compile(r"[^=:;\s]{1,256}")


def parse_rights(text: str) -> frozenset[str]:
    """``Send,Listen`` (any case) to the rights it grants; Manage brings Send and Listen with it."""
    rights: set[str] = set()
    for item in text.split(","):
        name = item.strip()
        match = [right for right in RIGHTS if right.lower() == name.lower()]
        if not match:
            raise ValueError(f"{name!r} is not a right; use a comma-separated list of Send, Listen, Manage")
        rights.add(match[0])
    if MANAGE in rights:
        rights |= ALL_RIGHTS
    return frozenset(rights)


def rights_text(rights: Iterable[str]) -> str:
    return ",".join(right for right in RIGHTS if right in set(rights))


@dataclass(frozen=True)
class SasKey:
    """A shared access rule: a key name, its key, and the rights a token signed with it grants."""

    name: str
    key: str
    rights: frozenset[str] = ALL_RIGHTS


EntityRules = Callable[[str], Iterable[tuple[str, Sequence[str], Iterable[str]]]]
"""``entity -> [(key name, (primary, secondary), rights)]``: the shared access rules of the queue or topic named
``entity`` (none when there is no such entity; never those of an entity whose name is a prefix of it)."""

Candidate = tuple[str, frozenset[str], str | None]
"""A key a token may have been signed with: (key, the rights it grants, the entity it is bound to or None)."""


class KeyRing(Mapping[str, str]):
    """The namespace's keys: a mapping of key name to key (as everything that verifies tokens reads them) that
    also knows each key's rights. A plain ``{name: key}`` mapping means all rights for every key."""

    def __init__(self, keys: Iterable[SasKey], *, namespace: str | None = None) -> None:
        # the namespace these keys serve (None: the default one); a created one's keys answer to ``name@namespace``
        self.namespace = namespace
        self._suffix = None if namespace is None else NAMESPACE_SEPARATOR + namespace
        self._keys: dict[str, SasKey] = {}
        for key in keys:
            if key.name in self._keys:
                raise ValueError(f"the SAS key name {key.name!r} is given twice; give each key name once")
            self._keys[key.name] = key

    @classmethod
    def of(cls, keys: Mapping[str, str]) -> KeyRing:
        if isinstance(keys, KeyRing):
            return keys
        return cls(SasKey(name, key) for name, key in keys.items())

    def _base(self, name: str) -> str:
        if self._suffix is not None and name.endswith(self._suffix):
            return name[: -len(self._suffix)]
        return name

    def __getitem__(self, name: str) -> str:
        return self._keys[self._base(name)].key

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def rights(self, name: str) -> frozenset[str]:
        key = self._keys.get(self._base(name))
        return key.rights if key is not None else frozenset()

    def entries(self) -> list[SasKey]:
        return list(self._keys.values())

    def with_right(self, right: str) -> SasKey | None:
        """The first key that has ``right``."""
        return next((key for key in self._keys.values() if right in key.rights), None)

    def for_namespace(self, namespace: str) -> KeyRing:
        """The same keys for the created namespace ``namespace`` (key names ``name@namespace``), no entity rules."""
        return KeyRing(self._keys.values(), namespace=namespace)

    def printed(self) -> SasKey:
        """The key the printed connection string carries: the first with Manage, else the first."""
        return self.with_right(MANAGE) or next(iter(self._keys.values()))

    def __repr__(self) -> str:  # never the keys themselves
        return "KeyRing(" + ", ".join(f"{k.name}:{rights_text(k.rights)}" for k in self._keys.values()) + ")"

    def attach_entity_rules(self, lookup: EntityRules) -> None:
        """Let tokens signed with an entity's own shared access rules in: ``lookup(entity)`` gives the rules of
        the queue or topic named ``entity``, as (key name, keys, rights) triples. The namespace's keys are looked
        up first."""
        self._entity_rules = lookup

    def candidates(self, name: str, path: str) -> list[Candidate]:
        """The keys a token signed by ``name`` for the resource ``path`` may have used, with their rights and the
        entity they are bound to: the namespace key of that name (bound to none), else the primary and secondary
        key of that rule of the entity ``path`` belongs to (:func:`entity_of_path`), bound to that entity."""
        key = self._keys.get(name)
        if key is not None:
            return [(key.key, key.rights, None)]
        lookup: EntityRules | None = getattr(self, "_entity_rules", None)
        entity = entity_of_path(normalize_path(path))
        if lookup is None or not entity:
            return []
        for rule_name, keys, rights in lookup(entity):
            if rule_name == name:
                granted = frozenset(rights) | (ALL_RIGHTS if MANAGE in rights else frozenset())
                return [(k, granted, entity) for k in keys]
        return []


def rights_of(keys: Mapping[str, str], name: str) -> frozenset[str]:
    return keys.rights(name) if isinstance(keys, KeyRing) else (ALL_RIGHTS if name in keys else frozenset())


def parse_key_spec(spec: str) -> SasKey:
    """``NAME=KEY`` (all rights) or ``NAME:RIGHTS=KEY`` (e.g. ``sender:Send=s3cr3t``)."""
    head, sep, key = spec.partition("=")
    name, colon, rights = head.strip().partition(":")
    name = name.strip()
    if not sep or not key or not _KEY_NAME.fullmatch(name):
        # never the key itself (without '=' the whole text may be one)
        shown = f"SAS key {head[:60] + '=...'!r}" if sep else "a SAS key without '='"
        raise ValueError(
            f"{shown} is not of the form NAME=KEY or NAME:RIGHTS=KEY (RIGHTS: a comma-separated list of "
            "Send, Listen, Manage; NAME without '=', ':', ';' or spaces)"
        )
    return SasKey(name, key, parse_rights(rights) if colon else ALL_RIGHTS)


def parse_keys(text: str) -> KeyRing:
    """Key specs (see :func:`parse_key_spec`) separated by ``;`` or newlines, as in ``ONCEBUS_SAS_KEYS`` or a
    keys file; blank lines and lines starting with ``#`` are skipped."""
    specs = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        specs += [item.strip() for item in line.split(";") if item.strip()]
    if not specs:
        raise ValueError("no SAS key given; use NAME=KEY or NAME:RIGHTS=KEY, separated by ';' or newlines")
    return KeyRing(parse_key_spec(spec) for spec in specs)


def read_keys_file(path: str | os.PathLike[str]) -> KeyRing:
    """A keys file: one ``NAME=KEY`` or ``NAME:RIGHTS=KEY`` a line (``#`` comments)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the keys file {os.fspath(path)!r}: {exc}") from None
    try:
        return parse_keys(text)
    except ValueError as exc:
        raise ValueError(f"keys file {os.fspath(path)!r}: {exc}") from None


def uses_public_key(keys: Mapping[str, str]) -> bool:
    """True when one of ``keys`` is the emulator's documented (public) key."""
    return any(hmac.compare_digest(key.encode(), DEFAULT_KEY.encode()) for key in keys.values())


def is_loopback(host: str) -> bool:
    """True for a listen address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Grant:
    """What a verified token allows: the path it covers, until when (epoch seconds), with which rights,
    for which host (None: the token names none), and, for a token signed with an entity's own rule, the
    entity it is bound to (None: a namespace key's)."""

    resource_path: str
    expires_at: float
    key_name: str
    rights: frozenset[str] = ALL_RIGHTS
    host: str | None = None
    entity: str | None = None

    def covers(self, entity_path: str, now: float) -> bool:
        return self.refusal(normalize_path(entity_path), now) is None

    def refusal(self, wanted: str, now: float) -> str | None:
        """None when this grant reaches the normalized path ``wanted`` at ``now``; otherwise why not."""
        if now >= self.expires_at:
            return f"the token for {self.resource_path or '/'!r} expired at {int(self.expires_at)}"
        if not path_covers(self.resource_path, wanted):
            return f"the token for {self.resource_path or '/'!r} does not cover {wanted or 'the namespace'!r}"
        if self.entity is not None and entity_of_path(wanted) != self.entity:
            other = entity_of_path(wanted)
            return (
                f"the token is signed with {self.key_name!r}, a shared access rule of the entity {self.entity!r}, "
                "which grants on that entity only (its sub-queues, subscriptions and $management node), not on "
                + (f"the entity {other!r}: use a rule of {other!r}" if other else "the namespace")
                + " or a namespace key"
            )
        return None


def normalize_path(path: str) -> str:
    """Paths compare case-insensitively, URL-decoded, without surrounding slashes."""
    return unquote(path).strip("/").lower()


def resource_path(uri: str) -> str:
    """The path part of a resource URI (``sb://host:port/orders`` -> ``orders``); a bare path is kept."""
    if "://" in uri:
        return normalize_path(urlsplit(uri).path)
    return normalize_path(uri)


def resource_host(uri: str) -> str | None:
    """The host of a resource URI without its port, lower-case (None for a bare path)."""
    if "://" not in uri:
        return None
    try:
        host = urlsplit(uri).hostname
    except ValueError:
        return None
    return host.lower() if host else None


def bare_host(host: str | None) -> str | None:
    """``Host``/open hostname without its port, lower-case (None when not given)."""
    if not host:
        return None
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0] or None
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host or None


def check_host(grant: Grant, host: str | None) -> None:
    """Refuse a token made for another host than the one the client talks to (when both are known)."""
    wanted = bare_host(host)
    if grant.host is not None and wanted is not None and grant.host != wanted:
        raise UnauthorizedError(
            f"the token is for host {grant.host!r}, but this client talks to {wanted!r}: make the token for the "
            "host in the connection string"
        )


def path_covers(scope: str, entity_path: str) -> bool:
    """True when ``scope`` is ``entity_path`` or one of its ancestors, on a segment boundary."""
    if scope == "":
        return True
    return entity_path == scope or entity_path.startswith(scope + "/")


def ancestors(path: str) -> list[str]:
    """``a/b/c`` -> ``["", "a", "a/b", "a/b/c"]``: every scope that covers ``path``."""
    path = normalize_path(path)
    out = [""]
    if path:
        parts = path.split("/")
        out += ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return out


def access_denied(
    grants: Iterable[Grant],
    path: str,
    right: str | None,
    now: float,
    *,
    shown: str | None = None,
    hint: str | None = None,
) -> str | None:
    """The one access check of every door: None when one of ``grants`` (the tokens an AMQP connection holds, or
    the one an HTTP request carries) reaches ``path`` at ``now`` with ``right`` (None: any right); otherwise
    why not, in Azure's words when a token reaches it without the right. ``shown``: the resource that text
    names (default: ``path``); ``hint``: what to do, added when no token reaches ``path``."""
    wanted = normalize_path(path)
    reaching = False
    reasons = []
    for grant in grants:
        why = grant.refusal(wanted, now)
        if why is not None:
            reasons.append(why)
        elif right is None or right in grant.rights:
            return None
        else:
            reaching = True
    if reaching:
        assert right is not None
        return missing_right_text(right, wanted if shown is None else shown)
    why = "; ".join(reasons) or "no valid token covers it"
    text = f"Unauthorized access to {wanted or 'the namespace'!r}: {why}"
    return text if hint is None else f"{text}; {hint}"


def refusal_text(error: UnauthorizedError) -> str:
    """An authorization error as a door answers it: starting ``Unauthorized`` (once)."""
    text = str(error)
    return text if text.startswith("Unauthorized") else f"Unauthorized: {text}"


def missing_right_text(right: str, resource: str) -> str:
    """Azure's text for a token without the right an operation needs."""
    return f"Unauthorized access. '{right}' claim(s) are required to perform this operation. Resource: '{resource}'."


def sign(encoded_resource: str, expiry: int, key: str) -> str:
    digest = hmac.new(key.encode("utf-8"), f"{encoded_resource}\n{expiry}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def make_token(resource_uri: str, key_name: str, key: str, expiry: int) -> str:
    """A token as the Service Bus SDKs build it (used by tests and tools)."""
    signature = sign(quote_plus(resource_uri), expiry, key)
    return TOKEN_PREFIX + urlencode({"sr": resource_uri, "sig": signature, "se": str(expiry), "skn": key_name})


def split_key_name(skn: str, keys: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """A token's ``skn`` field (as it appears in the token) -> (key name, namespace): ``RootManageSharedAccessKey@t1``
    names the key ``RootManageSharedAccessKey`` of the namespace ``t1`` (see ``oncebus.server.namespaces``); no
    ``@``: the default namespace (None). The Python SDK quotes the key name before url-encoding the token, so its
    ``@`` arrives as ``%2540``: the name is decoded until it no longer changes before it is split. A key of the
    default namespace whose name holds ``@`` itself (``keys``) keeps meaning that key."""
    once = unquote_plus(skn)
    if keys is not None and getattr(keys, "namespace", None) is None and once in keys:
        return once, None
    name = once
    for _ in range(4):  # %2540 -> %40 -> @ (a few rounds at most)
        decoded = unquote(name)
        if decoded == name:
            break
        name = decoded
    if NAMESPACE_SEPARATOR not in name:
        return once, None
    base, _, namespace = name.rpartition(NAMESPACE_SEPARATOR)
    return base, namespace


def token_namespace(token: object, keys: Mapping[str, str] | None = None) -> str | None:
    """The namespace a SAS token's key name selects (None: the default one, or no readable ``skn``)."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        return None
    for part in token[len(TOKEN_PREFIX) :].split("&"):
        name, sep, value = part.partition("=")
        if name == "skn" and sep:
            return split_key_name(value, keys)[1]
    return None


def header_namespace(header: str | None, keys: Mapping[str, str] | None = None) -> str | None:
    """The namespace an HTTP ``Authorization`` header selects: a SAS token's key name, or HTTP Basic's user
    (``key@namespace``); None: the default namespace."""
    if header is None:
        return None
    if header[:6].lower() == "basic ":
        try:
            user = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")[0]
        except (ValueError, UnicodeDecodeError):
            return None
        if (keys is not None and getattr(keys, "namespace", None) is None and user in keys) or (
            NAMESPACE_SEPARATOR not in user
        ):
            return None
        return user.rpartition(NAMESPACE_SEPARATOR)[2]
    return token_namespace(header, keys)


def verify_token(token: str, keys: Mapping[str, str], now: float | None = None, namespace: str | None = None) -> Grant:
    """Check a SAS token's form, key, signature and expiry; raise :class:`UnauthorizedError` if any fails.
    ``namespace``: the namespace ``keys`` belong to (None: the default one); a token naming another is refused."""
    if now is None:
        now = time.time()
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        raise UnauthorizedError("the token is not a shared access signature (SharedAccessSignature sr=...&sig=...)")
    fields: dict[str, str] = {}
    for part in token[len(TOKEN_PREFIX) :].split("&"):
        name, sep, value = part.partition("=")
        if not sep or name in fields:
            raise UnauthorizedError(f"malformed shared access signature field {part[:80]!r}")
        fields[name] = value
    missing = [name for name in ("sr", "sig", "se", "skn") if not fields.get(name)]
    if missing:
        raise UnauthorizedError(f"the shared access signature lacks {', '.join(missing)}")
    key_name, named = split_key_name(fields["skn"], keys)
    if namespace is None:
        namespace = getattr(keys, "namespace", None)
    if named != namespace:
        raise UnauthorizedError(
            f"the token's key name names namespace {named or '(the default one)'!r}, but it was presented to "
            f"namespace {namespace or '(the default one)'!r}: one connection serves one namespace"
        )
    resource = unquote_plus(fields["sr"])
    candidates: list[Candidate]
    if isinstance(keys, KeyRing):
        candidates = keys.candidates(key_name, resource_path(resource))
    else:
        key = keys.get(key_name)
        candidates = [] if key is None else [(key, ALL_RIGHTS, None)]
    if not candidates:
        raise UnauthorizedError(
            f"unknown shared access key name {key_name[:80]!r} (neither a namespace key nor a rule of the entity "
            "the token is for)"
        )
    if not _SE.fullmatch(fields["se"]) or int(fields["se"]) > MAX_EXPIRY:
        raise UnauthorizedError(
            f"the expiry se={fields['se'][:40]!r} is not a whole number of seconds since 1970 up to {MAX_EXPIRY} "
            "(the end of year 9999)"
        )
    expiry = int(fields["se"])
    given = unquote(fields["sig"]).encode()
    signer = next(  # an entity rule has two keys: either signs
        (
            (granted, entity)
            for key, granted, entity in candidates
            if hmac.compare_digest(sign(fields["sr"], expiry, key).encode(), given)
        ),
        None,
    )
    if signer is None:
        raise UnauthorizedError(f"the signature does not match key {key_name!r}")
    if expiry <= now:
        raise UnauthorizedError(f"the token expired at {expiry} (now {int(now)})")
    rights, entity = signer
    return Grant(resource_path(resource), float(expiry), key_name, rights, resource_host(resource), entity)


def authorize(
    token: str, audience: str, keys: Mapping[str, str], now: float | None = None, namespace: str | None = None
) -> Grant:
    """Verify ``token`` and check that it covers ``audience`` (the CBS request's ``name``)."""
    if now is None:
        now = time.time()
    grant = verify_token(token, keys, now, namespace)
    wanted = resource_path(audience)
    denied = access_denied([grant], wanted, None, now)
    if denied is not None:
        raise UnauthorizedError(denied)
    check_host(grant, resource_host(audience))
    # the client asked for this audience: that is what the token now grants on this connection
    return dataclasses.replace(grant, resource_path=wanted)


def authorize_request(
    header: str | None,
    keys: Mapping[str, str],
    path: str,
    right: str,
    *,
    host: str | None,
    now: float,
    shown: str | None = None,
    missing: str = "sign it with a SharedAccessSignature made with one of the namespace's keys",
    namespace: str | None = None,
    basic: bool = False,
) -> Grant:
    """An HTTP request's ``Authorization`` header checked as Azure checks it: a valid token that reaches ``path``
    (the URL used), made for ``host`` (when both name one), with ``right``. ``shown`` names the resource in the
    missing-right text (default: ``path``); ``missing`` says what to do when the header is absent. ``basic``:
    HTTP Basic is taken too (user: a namespace key's name, password: the key), for the whole namespace (the
    doors a browser, ``curl -u`` or a scraper use: ``/$faults``, ``/$namespaces``, the dashboard, ``/metrics``)."""
    if header is None:
        raise UnauthorizedError(f"the request has no Authorization header: {missing}")
    if basic and header[:6].lower() == "basic ":
        grant = basic_grant(header, keys)
    else:
        grant = verify_token(header, keys, now, namespace)
    check_host(grant, host)
    denied = access_denied([grant], path, right, now, shown=shown)
    if denied is not None:
        raise UnauthorizedError(denied)
    return grant


def basic_grant(header: str, keys: Mapping[str, str]) -> Grant:
    """HTTP Basic credentials (``Basic base64(name:key)``) of a namespace key: that key's rights on the whole
    namespace, with no expiry."""
    try:
        name, _, key = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise UnauthorizedError("the Basic credentials are not base64 of NAME:KEY") from None
    known = keys.get(name)
    if known is None or not hmac.compare_digest(known.encode(), key.encode()):
        raise UnauthorizedError("unknown key name or wrong key")
    return Grant("", math.inf, name, rights_of(keys, name))


def connection_string(host: str, port: int, key_name: str = DEFAULT_KEY_NAME, key: str = DEFAULT_KEY) -> str:
    """The connection string for the SDKs (plain AMQP on ``host:port``)."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key_name};SharedAccessKey={key};UseDevelopmentEmulator=true"
    )
