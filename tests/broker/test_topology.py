from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Namespace
from oncebus.broker.topology import apply_topology, load_topology
from oncebus.core.errors import ImmutablePropertyError, InvalidArgumentError, SqlExpressionError, StoreError
from oncebus.core.rules import CorrelationRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import run

EMULATOR_CONFIG = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [
                    {
                        "Name": "queue.1",
                        "Properties": {
                            "DeadLetteringOnMessageExpiration": False,
                            "DefaultMessageTimeToLive": "PT1H",
                            "DuplicateDetectionHistoryTimeWindow": "P7D",
                            "ForwardDeadLetteredMessagesTo": "",
                            "ForwardTo": "",
                            "LockDuration": "PT1M",
                            "MaxDeliveryCount": 3,
                            "RequiresDuplicateDetection": True,
                            "RequiresSession": False,
                            "EnablePartitioning": True,
                        },
                    }
                ],
                "Topics": [
                    {
                        "Name": "topic.1",
                        "Properties": {
                            "DefaultMessageTimeToLive": "PT1H",
                            "DuplicateDetectionHistoryTimeWindow": "PT20S",
                            "RequiresDuplicateDetection": True,
                        },
                        "Subscriptions": [
                            {
                                "Name": "subscription.1",
                                "Properties": {"MaxDeliveryCount": 5, "LockDuration": "PT30S"},
                                "Rules": [
                                    {
                                        "Name": "app",
                                        "Properties": {
                                            "FilterType": "Correlation",
                                            "CorrelationFilter": {"ContentType": "application/json"},
                                        },
                                    }
                                ],
                            }
                        ],
                    }
                ],
            }
        ],
        "Logging": {"Type": "File"},
    }
}


def test_emulator_config_creates_entities_and_reapplies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(EMULATOR_CONFIG))

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await apply_topology(ns, load_topology(path))
        queue = ns.get_queue("queue.1")
        assert queue.requires_duplicate_detection and queue.enable_partitioning
        assert queue.duplicate_detection_history_time_window == timedelta(days=7)
        assert queue.max_delivery_count == 3
        assert ns.get_topic("topic.1").duplicate_detection_history_time_window == timedelta(seconds=20)
        assert ns.get_subscription("topic.1", "subscription.1").lock_duration == timedelta(seconds=30)
        rules = ns.list_rules("topic.1", "subscription.1")
        assert [(r.name, r.filter) for r in rules] == [("app", CorrelationRuleFilter(content_type="application/json"))]
        await apply_topology(ns, load_topology(path))  # idempotent at every start
        assert ns.list_rules("topic.1", "subscription.1") == rules
        changed = json.loads(json.dumps(EMULATOR_CONFIG))
        changed["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]["RequiresDuplicateDetection"] = False
        path.write_text(json.dumps(changed))
        with pytest.raises(ImmutablePropertyError):
            await apply_topology(ns, load_topology(path))

    run(go())
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"Namespaces": []}', "UserConfig"),
    ],
)
def test_bad_topology_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InvalidArgumentError, match=message):
        load_topology(path)


EMULATOR_EXAMPLE = Path(__file__).parents[1] / "data" / "emulator" / "Config.json"


def _file(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _queues(*queues: object) -> dict[str, object]:
    return {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": list(queues)}]}}


def test_the_emulators_example_with_comments_loads_unchanged() -> None:
    text = EMULATOR_EXAMPLE.read_text()
    assert "// Other supported properties" in text
    topology = load_topology(EMULATOR_EXAMPLE)
    assert [q.name for q in topology.queues] == ["queue.1"]
    assert [(s.topic, s.name) for s in topology.subscriptions] == [
        ("topic.1", f"subscription.{i}") for i in (1, 2, 3, 4)
    ]
    assert topology.warnings == []
    rules = {s.name: s.rules for s in topology.subscriptions}
    assert rules["subscription.1"] == [
        RuleProperties("app-prop-filter-1", CorrelationRuleFilter(content_type="application/json"))
    ]
    assert rules["subscription.2"] == [
        RuleProperties("user-prop-filter-1", CorrelationRuleFilter(properties={"prop1": "value1"}))
    ]
    assert rules["subscription.3"] is None  # no Rules: $Default when created
    assert rules["subscription.4"] == [
        RuleProperties(
            "sql-filter-1",
            SqlRuleFilter("sys.MessageId = '123456' AND userProp1 = 'value1'"),
            SqlRuleAction("SET sys.To = 'Entity'"),
        )
    ]


def test_comments_inside_strings_are_kept(tmp_path: Path) -> None:
    content = """{
      /* a block comment */
      "UserConfig": {"Namespaces": [{"Queues": [
        {"Name": "q", "Properties": {"UserMetadata": "http://example.com/a // b /* c */"}}, // trailing
      ]}]}
    }"""
    topology = load_topology(_file(tmp_path, content))
    assert topology.queues[0].properties == {"user_metadata": "http://example.com/a // b /* c */"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "the top level must be an object"),
        ("null", "not null"),
        ('{"UserConfig": []}', "UserConfig must be an object"),
        ('{"UserConfig": {"Namespaces": {}}}', "Namespaces must be a list"),
        ('{"UserConfig": {"Namespaces": ["ns"]}}', r"Namespaces\[0\]: each namespace must be an object"),
        ('{"UserConfig": {"Namespaces": [{"Queues": "q"}]}}', "Queues must be a list"),
        (_queues("orders"), r"Queues\[0\]: each queue must be an object \{...\}, not a string 'orders'"),
        (_queues({"Properties": {}}), r"Queues\[0\]: Name is missing"),
        (_queues({"Name": 5}), r"Queues\[0\]: Name must be a string, not a number 5"),
        (_queues({"Name": "a b"}), r"queue 'a b' \(.*Queues\[0\]\): Name: queue name 'a b' is not valid"),
        (_queues({"Name": "q", "Properties": []}), r"queue 'q' .*: Properties must be an object"),
        (_queues({"Name": "q", "Propertes": {}}), "unknown key 'Propertes'"),
        (_queues({"Name": "q", "Properties": {"Colour": "red"}}), r"Properties\.Colour: unknown queue property"),
        (_queues({"Name": "q", "Properties": {"SupportOrdering": True}}), "SupportOrdering: unknown queue property"),
        (
            '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"MaxDeliveryCount": NaN}}]}]}}',
            r"Properties\.MaxDeliveryCount: NaN is not allowed",
        ),
        (
            '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"LockDuration": -Infinity}}]}]}}',
            r"Properties\.LockDuration: Infinity is not allowed",
        ),
        (
            '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"MaxDeliveryCount": 1e400}}]}]}}',
            "Infinity is not allowed",
        ),
        ('{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Name": "r"}]}]}}', "Duplicate key"),
        ('{"UserConfig": {"Namespaces": [\n{"Queues": [,]}]}}', "not valid JSON.*line 2"),
        ("[" * 5000 + "]" * 5000, "nested too deeply|the top level"),
    ],
)
def test_shape_errors_are_one_line_naming_entity_and_field(tmp_path: Path, content: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        load_topology(_file(tmp_path, content))
    assert "\n" not in str(caught.value) and str(caught.value).startswith("topology file ")


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ({"Name": "q", "Properties": {"MaxDeliveryCount": 1e308}}, r"MaxDeliveryCount: max_delivery_count 1e\+308"),
        ({"Name": "q", "Properties": {"DefaultMessageTimeToLive": 1e308}}, "DefaultMessageTimeToLive: .*out of range"),
        ({"Name": "q", "Properties": {"LockDuration": "P99999999999D"}}, "LockDuration: .*out of range"),
        ({"Name": "q", "Properties": {"LockDuration": "PT1H"}}, "LockDuration: lock_duration PT1H is out of range"),
        ({"Name": "q", "Properties": {"RequiresSession": "yes"}}, "RequiresSession: requires_session must be true"),
        ({"Name": "q", "Properties": {"ForwardTo": "other"}}, "ForwardTo: no queue or topic named 'other'"),
        ({"Name": "q", "Properties": {"ForwardTo": "q"}}, "ForwardTo: a queue cannot forward to itself"),
        ({"Name": "q", "Properties": {"AutoDeleteOnIdle": "PT1M"}}, "AutoDeleteOnIdle: .*at least 5 minutes"),
        ({"Name": "Q1"}, r"queue 'Q1' .*Queues\[2\]\): the name is already used by queue 'q1' .*Queues\[0\]"),
        ({"Name": "t1"}, "a topic named 't1' already exists in the data directory"),
        ({"Name": "locked", "Properties": {"RequiresDuplicateDetection": False}}, "cannot be changed after creation"),
    ],
)
def test_a_bad_third_entity_leaves_everything_as_it_was(tmp_path: Path, queue: dict[str, object], message: str) -> None:
    config = _queues(
        {"Name": "q1", "Properties": {"RequiresDuplicateDetection": True}},
        {
            "Name": "kept",
            "Properties": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "P1D"},
        },
        queue,
    )

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_topic("t1")
        await ns.create_queue("locked", requires_duplicate_detection=True)
        await ns.create_queue("kept", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M")
        with pytest.raises(InvalidArgumentError, match=message) as caught:
            await apply_topology(ns, load_topology(_file(tmp_path, config)))
        assert "\n" not in str(caught.value)
        assert sorted(q.name for q in ns.list_queues()) == ["kept", "locked"]
        assert ns.get_queue("kept").duplicate_detection_history_time_window == timedelta(minutes=1)

    run(go())


def test_a_failure_while_applying_undoes_what_was_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store failure after validation (here: the third write) leaves nothing of the file behind."""
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Queues": [
                        {"Name": "new", "Properties": {"MaxDeliveryCount": 4}},
                        {"Name": "kept", "Properties": {"MaxDeliveryCount": 7}},
                    ],
                    "Topics": [{"Name": "t", "Subscriptions": [{"Name": "s"}]}],
                }
            ]
        }
    }

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("kept", max_delivery_count=2)

        async def disk_full(*args: object, **kwargs: object) -> None:
            raise StoreError("database or disk is full")

        monkeypatch.setattr(ns, "create_subscription", disk_full)
        with pytest.raises(StoreError, match=r"applying subscription 't/s' .* disk is full; nothing of the file"):
            await apply_topology(ns, load_topology(_file(tmp_path, config)))
        assert [q.name for q in ns.list_queues()] == ["kept"] and ns.list_topics() == []
        assert ns.get_queue("kept").max_delivery_count == 2

    run(go())


def _topic_with_rules(rules: object, name: str = "s") -> dict[str, object]:
    return {
        "UserConfig": {
            "Namespaces": [
                {
                    "Queues": [{"Name": "q"}],
                    "Topics": [{"Name": "t", "Subscriptions": [{"Name": "ok"}, {"Name": name, "Rules": rules}]}],
                }
            ]
        }
    }


@pytest.mark.parametrize(
    ("rules", "error", "message"),
    [
        (
            [{"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a = = 1"}}}],
            SqlExpressionError,
            r"subscription 't/s' \(UserConfig.Namespaces\[0\].Topics\[0\].Subscriptions\[1\]\): Rules\[0\] \('r'\): "
            r"invalid SQL filter at line 1, column 5",
        ),
        (
            [
                {
                    "Name": "r",
                    "Properties": {
                        "FilterType": "Sql",
                        "SqlFilter": {"SqlExpression": "1=1"},
                        "Action": {"SqlExpression": "SET sys.Nope = 1"},
                    },
                }
            ],
            SqlExpressionError,
            r"Rules\[0\] \('r'\): .*Nope",
        ),
        (
            [{"Name": "r", "Properties": {"FilterType": "Lambda"}}],
            InvalidArgumentError,
            "FilterType must be Sql or Correlation",
        ),
        (
            [
                {"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"To": "x"}}},
                {"Name": "R", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"To": "y"}}},
            ],
            InvalidArgumentError,
            "used twice",
        ),
    ],
)
def test_bad_rules_refuse_the_whole_file(tmp_path: Path, rules: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        load_topology(_file(tmp_path, _topic_with_rules(rules)))
    assert "\n" not in str(caught.value) and str(caught.value).startswith("topology file ")


def test_rules_of_the_file_replace_those_of_an_existing_subscription_and_are_undone(tmp_path: Path) -> None:
    rules = [{"Name": "to-x", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"To": "x"}}}]

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        await ns.create_rule("t", "s", RuleProperties("mine", SqlRuleFilter("a = 1")))
        await ns.create_subscription("t", "ok")
        await ns.create_rule("t", "ok", RuleProperties("kept", SqlRuleFilter("b = 1")))
        await apply_topology(ns, load_topology(_file(tmp_path, _topic_with_rules(rules))))
        assert [r.name for r in ns.list_rules("t", "s")] == ["to-x"]
        assert [r.name for r in ns.list_rules("t", "ok")] == ["$Default", "kept"]  # no Rules in the file: kept

        # a file whose last step fails leaves the rules as they were
        config = _topic_with_rules(
            [{"Name": "y", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}}]
        )
        config["UserConfig"]["Namespaces"][0]["Queues"].append({"Name": "fwd", "Properties": {"ForwardTo": "t"}})  # type: ignore[index]
        real = ns.update_queue

        async def failing(name: str, **changes: object) -> object:
            if changes.get("forward_to"):
                raise StoreError("database or disk is full")
            return await real(name, **changes)

        ns.update_queue = failing  # type: ignore[method-assign]
        with pytest.raises(StoreError, match="nothing of the file was kept"):
            await apply_topology(ns, load_topology(_file(tmp_path, config)))
        assert [r.name for r in ns.list_rules("t", "s")] == ["to-x"]
        assert [q.name for q in ns.list_queues()] == ["q"]

    run(go())


def test_forwarding_may_name_an_entity_later_in_the_file(tmp_path: Path) -> None:
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Queues": [
                        {"Name": "first", "Properties": {"ForwardTo": "t", "ForwardDeadLetteredMessagesTo": "last"}},
                        {"Name": "last"},
                    ],
                    "Topics": [{"Name": "t", "Subscriptions": [{"Name": "s", "Properties": {"ForwardTo": "last"}}]}],
                }
            ]
        }
    }

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await apply_topology(ns, load_topology(_file(tmp_path, config)))
        first = ns.get_queue("first")
        assert (first.forward_to, first.forward_dead_lettered_messages_to) == ("t", "last")
        assert ns.get_subscription("t", "s").forward_to == "last"
        await apply_topology(ns, load_topology(_file(tmp_path, config)))  # again: nothing changes
        assert [r.name for r in ns.list_rules("t", "s")] == ["$Default"]

    run(go())
