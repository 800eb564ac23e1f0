"""Cross-entity transactions as Service Bus infers them (the Java SDK's ``enableCrossEntityTransactions``, the .NET
SDK's ``EnableCrossEntityTransactions``): no ``com.microsoft:transfer-destination-address``; the client opens one
AMQP session whose first link is a coordinator, then every sender and receiver link on it. The first entity a link
is attached to on that session (a subscription's topic) becomes the send-via entity: a sender to another queue or
topic on the session sends through it, as a send-via link does (in a transaction: to its destination at the
commit); a receiver on another top-level entity is refused (amqp:not-allowed), as Service Bus refuses it (the
.NET SDK's Sample06_Transactions: "a receive cannot be routed through a different entity"). ``$cbs`` and
``$management`` links are not entity links: they neither set nor meet the send-via entity."""

from __future__ import annotations

from oncebus.broker import parse_path
from oncebus.core.errors import InvalidOperationError

__all__ = ["CrossEntityScope"]


class CrossEntityScope:
    """The send-via entity of one cross-entity session: unset until the session's first entity link."""

    __slots__ = ("via",)

    def __init__(self) -> None:
        self.via: str | None = None

    def through(self, entity: str) -> str | None:
        """The entity a sender link to the queue or topic ``entity`` sends through: ``None`` when the send-via entity
        is unset (the link will set it with :meth:`claim`) or is ``entity`` itself."""
        return None if self.via is None or self.via == entity else self.via

    def claim(self, entity: str) -> None:
        """A sender link to ``entity`` opened: the session's first entity becomes its send-via entity."""
        if self.via is None:
            self.via = entity

    def receiver(self, address: str) -> bool:
        """Admit a receiver link on ``address`` (a queue, a subscription, a dead-letter queue): its top-level entity
        must be the send-via entity, or becomes it (then ``True``: the caller undoes it with :meth:`release` if the
        link is refused after all)."""
        top = parse_path(address).entity
        if self.via is None:
            self.via = top
            return True
        if self.via != top:
            raise InvalidOperationError(
                f"Local transactions cannot span multiple top-level entities such as queue or topic: this session's "
                f"links go through {self.via!r} (its first entity, the send-via entity of its cross-entity "
                f"transactions); a receiver on {top!r} needs a session (a client) of its own"
            )
        return False

    def release(self) -> None:
        """The link that set the send-via entity was refused: the next entity link sets it."""
        self.via = None
