"""A stand-in for azure-servicebus 7.15.0's ``tests/servicebus_preparer.py`` (the suite copies it over that file):
the same names and parameters, but what the original creates with ARM (``azure-mgmt-servicebus``, a resource
group, a new namespace) is made through oncebus's administration API, with the SDK's own
``ServiceBusAdministrationClient``, in the namespace the suite made for the test (oncebus_live.py).

- a resource group is a name (ResourceGroupPreparer);
- the namespace is the test's oncebus namespace, reached at ``localhost`` (``SERVICEBUS_ENDPOINT_SUFFIX`` is
  empty: ``f"{servicebus_namespace.name}{SERVICEBUS_ENDPOINT_SUFFIX}"`` is ``localhost``), with its root key;
- queues, topics and subscriptions are created with the properties the original gives ARM;
- a namespace authorization rule is one of the namespace keys with fewer rights the suite gave ``oncebus serve``
  (``--key NAME:RIGHTS=KEY``: oncebus makes no namespace keys at run time); a queue's is a rule of the queue's own
  (``authorization_rules``), used as ``<rule>@<namespace>``.
"""

from __future__ import annotations

import base64
import functools
import os
from typing import Any

import oncebus_live
from azure.servicebus.management import AccessRights, AuthorizationRule
from devtools_testutils import AzureMgmtPreparer, FakeResource, ResourceGroupPreparer
from devtools_testutils.resource_testcase import RESOURCE_GROUP_PARAM

SERVICEBUS_DEFAULT_AUTH_RULE_NAME = "RootManageSharedAccessKey"
SERVICEBUS_NAMESPACE_PARAM = "servicebus_namespace"
SERVICEBUS_TOPIC_PARAM = "servicebus_topic"
SERVICEBUS_SUBSCRIPTION_PARAM = "servicebus_subscription"
SERVICEBUS_QUEUE_PARAM = "servicebus_queue"
SERVICEBUS_AUTHORIZATION_RULE_PARAM = "servicebus_authorization_rule"
SERVICEBUS_QUEUE_AUTHORIZATION_RULE_PARAM = "servicebus_queue_authorization_rule"
SERVICEBUS_ENDPOINT_SUFFIX = ""
LOCATION = "westus"
ALL_RIGHTS = ("Manage", "Send", "Listen")


def _rights(access_rights: Any) -> tuple[str, ...]:
    """``azure.mgmt.servicebus``'s AccessRights (or their names) as oncebus's: Manage implies the other two."""
    names = {str(getattr(right, "value", right)).capitalize() for right in access_rights}
    return ("Manage",) if "Manage" in names else tuple(r for r in ("Send", "Listen") if r in names)


class ServiceBusResourceGroupPreparer(ResourceGroupPreparer):
    def __init__(self, name_prefix: str = "", use_cache: bool = False, **options: Any) -> None:
        super().__init__(name_prefix, use_cache, **options)


class ServiceBusNamespacePreparer(AzureMgmtPreparer):
    def __init__(
        self,
        name_prefix: str = "",
        use_cache: bool = False,
        sku: str = "Standard",
        location: str = LOCATION,
        parameter_name: str = SERVICEBUS_NAMESPACE_PARAM,
        resource_group_parameter_name: str = RESOURCE_GROUP_PARAM,
        **options: Any,
    ) -> None:
        super().__init__(name_prefix, 24, **options)
        if sku != "Standard":
            raise ValueError(f"the suite's namespaces are Standard (oncebus serve's tier), not {sku}")
        self.parameter_name = parameter_name

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return {
            self.parameter_name: FakeResource(name=oncebus_live.HOST, id=oncebus_live.namespace()),
            f"{self.parameter_name}_connection_string": oncebus_live.connection_string(),
            f"{self.parameter_name}_key_name": oncebus_live.key_name(),
            f"{self.parameter_name}_primary_key": oncebus_live.key(),
        }


class _ServiceBusChildResourcePreparer(AzureMgmtPreparer):
    def __init__(self, name_prefix: str = "", parameter_name: str = "", **options: Any) -> None:
        super().__init__(name_prefix, 24)
        self.parameter_name = parameter_name
        self.options = options

    def create(self, name: str, **kwargs: Any) -> None:
        raise NotImplementedError

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        self.create(name, **kwargs)
        return {self.parameter_name: FakeResource(name=name, id=name)}


class ServiceBusTopicPreparer(_ServiceBusChildResourcePreparer):
    def __init__(
        self, name_prefix: str = "", use_cache: bool = False, parameter_name: str = SERVICEBUS_TOPIC_PARAM, **kw: Any
    ) -> None:
        super().__init__(name_prefix, parameter_name)

    def create(self, name: str, **kwargs: Any) -> None:
        with oncebus_live.administration_client() as admin:
            admin.create_topic(name)


class ServiceBusSubscriptionPreparer(_ServiceBusChildResourcePreparer):
    def __init__(
        self,
        name_prefix: str = "",
        use_cache: bool = False,
        parameter_name: str = SERVICEBUS_SUBSCRIPTION_PARAM,
        resource_group_parameter_name: str = RESOURCE_GROUP_PARAM,
        servicebus_namespace_parameter_name: str = SERVICEBUS_NAMESPACE_PARAM,
        servicebus_topic_parameter_name: str = SERVICEBUS_TOPIC_PARAM,
        requires_session: bool = False,
        lock_duration: str = "PT60S",
        **kw: Any,
    ) -> None:
        super().__init__(name_prefix, parameter_name)
        self.topic_parameter_name = servicebus_topic_parameter_name
        self.requires_session = requires_session
        self.lock_duration = lock_duration

    def create(self, name: str, **kwargs: Any) -> None:
        topic = kwargs[self.topic_parameter_name]
        with oncebus_live.administration_client() as admin:
            admin.create_subscription(
                topic.name, name, requires_session=self.requires_session, lock_duration=self.lock_duration
            )


class ServiceBusQueuePreparer(_ServiceBusChildResourcePreparer):
    def __init__(
        self,
        name_prefix: str = "",
        use_cache: bool = False,
        requires_duplicate_detection: bool = False,
        dead_lettering_on_message_expiration: bool = False,
        requires_session: bool = False,
        enable_partitioning: bool = False,
        lock_duration: str = "PT30S",
        parameter_name: str = SERVICEBUS_QUEUE_PARAM,
        **kw: Any,
    ) -> None:
        super().__init__(name_prefix, parameter_name)
        self.properties = {
            "requires_duplicate_detection": requires_duplicate_detection,
            "dead_lettering_on_message_expiration": dead_lettering_on_message_expiration,
            "requires_session": requires_session,
            "enable_partitioning": enable_partitioning,
            "lock_duration": lock_duration,
        }

    def create(self, name: str, **kwargs: Any) -> None:
        with oncebus_live.administration_client() as admin:
            admin.create_queue(name, **self.properties)


class ServiceBusNamespaceAuthorizationRulePreparer(AzureMgmtPreparer):
    def __init__(
        self,
        name_prefix: str = "",
        use_cache: bool = False,
        access_rights: Any = ALL_RIGHTS,
        parameter_name: str = SERVICEBUS_AUTHORIZATION_RULE_PARAM,
        **kw: Any,
    ) -> None:
        super().__init__(name_prefix, 24)
        self.parameter_name = parameter_name
        self.rights = _rights(access_rights)

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        key_name, key = oncebus_live.rule_keys()[",".join(self.rights)]
        return {
            self.parameter_name: FakeResource(name=key_name, id=key_name),
            f"{self.parameter_name}_connection_string": oncebus_live.connection_string(key_name, key),
        }


class ServiceBusQueueAuthorizationRulePreparer(AzureMgmtPreparer):
    def __init__(
        self,
        name_prefix: str = "",
        use_cache: bool = False,
        access_rights: Any = ALL_RIGHTS,
        parameter_name: str = SERVICEBUS_QUEUE_AUTHORIZATION_RULE_PARAM,
        resource_group_parameter_name: str = RESOURCE_GROUP_PARAM,
        servicebus_namespace_parameter_name: str = SERVICEBUS_NAMESPACE_PARAM,
        servicebus_queue_parameter_name: str = SERVICEBUS_QUEUE_PARAM,
        **kw: Any,
    ) -> None:
        super().__init__(name_prefix, 24)
        self.parameter_name = parameter_name
        self.queue_parameter_name = servicebus_queue_parameter_name
        self.rights = _rights(access_rights)

    def create_resource(self, name: str, **kwargs: Any) -> dict[str, Any]:
        queue = kwargs[self.queue_parameter_name]
        key = base64.b64encode(os.urandom(32)).decode()
        rights = [AccessRights(r) for r in (ALL_RIGHTS if self.rights == ("Manage",) else self.rights)]
        with oncebus_live.administration_client() as admin:
            properties = admin.get_queue(queue.name)
            properties.authorization_rules = [
                *(properties.authorization_rules or []),
                AuthorizationRule(key_name=name, rights=rights, primary_key=key, secondary_key=key),
            ]
            admin.update_queue(properties)
        return {
            self.parameter_name: FakeResource(name=name, id=name),
            f"{self.parameter_name}_connection_string": oncebus_live.connection_string(name, key, queue.name),
        }


CachedServiceBusResourceGroupPreparer = functools.partial(ServiceBusResourceGroupPreparer, use_cache=True)
CachedServiceBusNamespacePreparer = functools.partial(ServiceBusNamespacePreparer, use_cache=True)
CachedServiceBusQueuePreparer = functools.partial(ServiceBusQueuePreparer, use_cache=True)
CachedServiceBusTopicPreparer = functools.partial(ServiceBusTopicPreparer, use_cache=True)
CachedServiceBusSubscriptionPreparer = functools.partial(ServiceBusSubscriptionPreparer, use_cache=True)
