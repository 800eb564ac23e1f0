"""The seam for subscription rules in the administration API.

Today oncebus evaluates no rules: every subscription receives every message,
which is exactly what Service Bus's ``$Default`` rule (a ``TrueFilter``) does.
:class:`DefaultRuleOnly` therefore shows that one rule on every subscription
and refuses to create, change or delete rules with HTTP 501 and a clear text.
When the rules engine lands, it provides a :class:`RuleBook` (same methods,
backed by the Namespace) and the server passes it to ``HttpApp(rules=...)``;
``admin.py`` needs no change.
"""

from __future__ import annotations

from typing import Protocol
from xml.etree.ElementTree import Element

from oncebus.broker.namespace import Namespace
from oncebus.broker.runtime_properties import UNKNOWN_TIME
from oncebus.core.errors import EntityNotFoundError
from oncebus.http.atom import EMPTY_ACTION_XML, TRUE_FILTER_XML, Description, RuleView
from oncebus.http.errors import NotImplementedFeatureError

DEFAULT_RULE = "$Default"
XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"
_NOT_YET = (
    "subscription rules are not evaluated by oncebus yet: every subscription has only the $Default rule "
    "(TrueFilter) and receives every message"
)


class RuleBook(Protocol):
    def list_rules(self, topic: str, subscription: str) -> list[RuleView]: ...

    def get_rule(self, topic: str, subscription: str, name: str) -> RuleView: ...

    async def put_rule(
        self, topic: str, subscription: str, name: str, description: Description, *, update: bool
    ) -> RuleView: ...

    async def delete_rule(self, topic: str, subscription: str, name: str) -> None: ...

    def check_default_rule(self, element: Element | None) -> None:
        """Refuse a subscription's ``DefaultRuleDescription`` that cannot be honoured (before creating it)."""


class DefaultRuleOnly:
    """Every subscription has the ``$Default`` TrueFilter rule; rules cannot be changed yet."""

    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace

    def _default(self) -> RuleView:
        return RuleView(DEFAULT_RULE, TRUE_FILTER_XML, EMPTY_ACTION_XML, UNKNOWN_TIME)

    def list_rules(self, topic: str, subscription: str) -> list[RuleView]:
        self.namespace.get_subscription(topic, subscription)
        return [self._default()]

    def get_rule(self, topic: str, subscription: str, name: str) -> RuleView:
        self.namespace.get_subscription(topic, subscription)
        if name.lower() != DEFAULT_RULE.lower():
            raise EntityNotFoundError(
                f"The messaging entity '{topic}/Subscriptions/{subscription}/Rules/{name}' could not be found"
            )
        return self._default()

    async def put_rule(
        self, topic: str, subscription: str, name: str, description: Description, *, update: bool
    ) -> RuleView:
        self.namespace.get_subscription(topic, subscription)
        raise NotImplementedFeatureError(f"cannot {'update' if update else 'create'} rule {name!r}: {_NOT_YET}")

    async def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        self.get_rule(topic, subscription, name)
        raise NotImplementedFeatureError(f"cannot delete rule {name!r}: {_NOT_YET}")

    def check_default_rule(self, element: Element | None) -> None:
        if element is None:
            return
        for child in element.iter():
            if child.tag.rsplit("}", 1)[-1] == "Filter" and child.get(XSI_TYPE, "TrueFilter") != "TrueFilter":
                raise NotImplementedFeatureError(f"a default rule with a {child.get(XSI_TYPE)}: {_NOT_YET}")
            if child.tag.rsplit("}", 1)[-1] == "Action" and child.get(XSI_TYPE, "EmptyRuleAction") != (
                "EmptyRuleAction"
            ):
                raise NotImplementedFeatureError(f"a default rule with a {child.get(XSI_TYPE)}: {_NOT_YET}")
