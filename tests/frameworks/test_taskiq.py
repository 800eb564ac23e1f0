"""docs/taskiq.md followed as written (tests/frameworks/walk.py says how): taskiq with taskiq-service-bus against
``oncebus serve`` on free ports, with the page's broker subclass (a MessageId from the task id and retry number);
then what the page says besides: a retry is a new message, a delayed task waits, the unchanged broker works
and its resends are not dropped."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.amqp.conftest import ServerProcess
from tests.frameworks.walk import ROOT, Walk, check_install, reader_folder, stats_row

PAGE = ROOT / "docs" / "taskiq.md"

BESIDES = """\
import asyncio
import time

from taskiq.kicker import AsyncKicker
from taskiq_service_bus import ServiceBusBroker

from app import CONNECTION_STRING, add, broker


async def main() -> None:
    await broker.startup()
    await add.kicker().with_task_id("invoice-42").with_labels(_retries=1).kiq(2, 3)  # a retry: a new message
    print("delayed sent at", time.time(), flush=True)  # before the send: its delay counts from a moment after
    await add.kicker().with_task_id("invoice-44").with_labels(delay=2).kiq(20, 2)  # runs two seconds later
    await broker.shutdown()
    unchanged = ServiceBusBroker(CONNECTION_STRING, "tasks")
    await unchanged.startup()
    for _ in range(2):  # two random MessageIds: both run
        await AsyncKicker("app:add", unchanged, {}).with_task_id("invoice-43").kiq(40, 3)
    await unchanged.shutdown()


asyncio.run(main())
"""

LOST = """\
import asyncio

from taskiq.kicker import AsyncKicker
from taskiq_service_bus import ServiceBusBroker

from app import CONNECTION_STRING, OnceBroker


async def main() -> None:
    for broker in (ServiceBusBroker(CONNECTION_STRING, "tasks"), OnceBroker(CONNECTION_STRING, "tasks-plain")):
        await broker.startup()
        await AsyncKicker("app:add", broker, {}).kiq(50, 5)  # its acknowledgement lost, the SDK sends it again
        await broker.shutdown()


asyncio.run(main())
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(reader_folder(tmp_path) / ".oncebus").start()
    try:
        yield process
    finally:
        process.stop()


def test_the_taskiq_page_as_written(server: ServerProcess) -> None:
    folder = server.data_dir.parent
    walk = Walk(PAGE, folder, {"5672": str(server.port)})
    try:
        check_install(walk.take("pip install", "sh"))
        assert walk.take("oncebus serve", "sh").code.strip() == ".venv/bin/oncebus serve"  # the test's server
        walk.run(walk.take("oncebus queue create tasks --duplicate-detection", "sh"))
        walk.run(walk.take("class OnceBroker(ServiceBusBroker)", "python"))
        worker = walk.start(walk.take("taskiq worker app:broker", "sh"), ready="Listening started.")

        walk.run(walk.take('with_task_id("invoice-42").kiq(2, 3)', "python"))
        shown = walk.take("Executing task app:add with ID: invoice-42", "text")
        output = worker.wait_for(r"add\(2, 3\) = 5")
        for line in shown.code.splitlines():  # what the page shows the worker printing, up to the log's prefix
            assert line.split("] ", 1)[-1] in output, (line, output[-3000:])
        stats = stats_row(walk.run(walk.take("oncebus stats tasks", "sh")), "tasks")
        assert (stats["ACCEPTED"], stats["DUPLICATES"]) == ("1", "1"), stats

        # a lost acknowledgement: the SDK sends again, and oncebus drops the copy (it ran once; none is left)
        walk.run(walk.take("await add.kiq(1, 2)", "python"))
        stats = stats_row(walk.run(walk.take("oncebus fault arm lost-ack --entity tasks", "sh")), "tasks")
        assert (stats["ACCEPTED"], stats["DUPLICATES"]) == ("2", "2"), stats
        worker.wait_for(r"add\(1, 2\) = 3")
        assert walk.idle_stats("tasks")["ACTIVE"] == "0"  # settled: the one copy stored ran
        walk.finish()

        (folder / "besides.py").write_text(textwrap.dedent(BESIDES))
        sent = walk.shell(".venv/bin/python besides.py", "besides.py")
        output = worker.wait_for(r"add\(40, 3\) = 43", count=2)
        worker.wait_for(r"add\(20, 2\) = 22")
        assert output.count("add(2, 3) = 5") == 2, output[-3000:]  # the first send and its retry
        assert output.count("add(1, 2) = 3") == 1, output[-3000:]  # the lost acknowledgement's send
        stats = stats_row(walk.shell(".venv/bin/oncebus stats tasks"), "tasks")
        assert (stats["ACCEPTED"], stats["DUPLICATES"]) == ("6", "2"), stats

        # "That much needs no subclass" (the unchanged broker, on tasks) "It needs the queue's duplicate
        # detection" (on tasks-plain, without it, two copies)
        (folder / "lost.py").write_text(textwrap.dedent(LOST))
        walk.shell(
            ".venv/bin/oncebus queue create tasks-plain\n"
            ".venv/bin/oncebus fault arm lost-ack --entity tasks\n"
            ".venv/bin/oncebus fault arm lost-ack --entity tasks-plain\n"
            ".venv/bin/python lost.py"
        )
        worker.wait_for(r"add\(50, 5\) = 55")
        stats = walk.idle_stats("tasks")
        assert (stats["ACCEPTED"], stats["DUPLICATES"], stats["ACTIVE"]) == ("7", "3", "0"), stats
        assert worker.output().count("add(50, 5) = 55") == 1
        plain = stats_row(walk.shell(".venv/bin/oncebus stats tasks-plain"), "tasks-plain")
        assert (plain["DEDUP"], plain["ACCEPTED"], plain["ACTIVE"]) == ("off", "2", "2"), plain
        sent_at = float(sent.split("delayed sent at ", 1)[1].split()[0])
        ran = next(line for line in worker.output().splitlines() if "with ID: invoice-44" in line)
        ran_at = datetime.strptime(ran[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # the log's local time
        assert ran_at >= sent_at + 1.9, (sent_at, ran)  # held until its time (2 s, less the log's rounding)
    finally:
        walk.stop()
