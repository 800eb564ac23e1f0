"""docs/celery.md followed as written (tests/frameworks/walk.py says how): Celery with kombu's Azure Service Bus
transport against ``oncebus serve``, the page's subclass (plain AMQP, a MessageId) and an unchanged app (TLS on
5671, oncebus's CA in certifi's bundle).

The unchanged app's SDK dials port 5671 whatever the URL says, so the server serves TLS on 5671 of a loopback
address of its own (127.x.y.z, checked free), and the page's 127.0.0.1 becomes that address. The page appends
oncebus's CA to certifi's bundle: here to a copy of certifi put first on PYTHONPATH, never to the test
environment's own.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest

from tests.amqp.conftest import ServerProcess
from tests.frameworks.walk import (
    ROOT,
    Walk,
    check_install,
    loopback_address_with_free,
    reader_folder,
    stats_row,
)

PAGE = ROOT / "docs" / "celery.md"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    folder = reader_folder(tmp_path)
    address = loopback_address_with_free(5671)
    process = ServerProcess(folder / ".oncebus", args=("--host", address, "--tls-port", "5671")).start()
    try:
        yield process
    finally:
        process.stop()


def _certifi_copy(tmp_path: Path) -> Path:
    """A copy of the installed certifi on its own path entry: what the page appends to, in place of the real one."""
    path = tmp_path / "certifi-copy"
    shutil.copytree(Path(certifi.__file__).parent, path / "certifi")
    return path


def test_the_celery_page_as_written(server: ServerProcess, tmp_path: Path) -> None:
    folder = server.data_dir.parent
    address = server.connection_string.split("sb://", 1)[1].split(":", 1)[0]
    assert f"TLS on {address}:5671 " in "\n".join(server.output) + " "
    copy = _certifi_copy(tmp_path)
    walk = Walk(PAGE, folder, {"127.0.0.1": address, "5672": str(server.port)}, env={"PYTHONPATH": str(copy)})
    try:
        check_install(walk.take("pip install", "sh"))
        assert walk.take("oncebus serve", "sh").code.strip() == ".venv/bin/oncebus serve"  # the test's server
        walk.run(walk.take("oncebus queue create celery --duplicate-detection", "sh"))
        walk.run(walk.take("class Channel(azureservicebus.Channel)", "python"))
        walk.run(walk.take("export REQUESTS_CA_BUNDLE=", "sh"))
        worker = walk.start(walk.take("celery -A tasks worker", "sh"), ready="ready.")

        walk.run(walk.take('add.apply_async((2, 3), task_id="invoice-42")', "python"))
        shown = walk.take("Task tasks.add[invoice-42]", "text")
        output = worker.wait_for(r"Task tasks\.add\[invoice-42\] succeeded")
        for line in shown.code.splitlines():  # what the page shows the worker printing, up to times and numbers
            said = re.escape(line.split("] ", 1)[1]).replace(r"0\.0003s", r"[0-9.e-]+s")
            assert re.search(said, output), (line, output[-3000:])
        stats = stats_row(walk.run(walk.take("oncebus stats celery", "sh")), "celery")
        assert (stats["ACCEPTED"], stats["DUPLICATES"]) == ("1", "1"), stats

        # a lost acknowledgement: the SDK sends again, and oncebus drops the copy (it ran once; none is left)
        stats = stats_row(walk.run(walk.take("oncebus fault arm lost-ack --entity celery", "sh")), "celery")
        assert (stats["ACCEPTED"], stats["DUPLICATES"]) == ("2", "2"), stats
        worker.wait_for(r"succeeded in [0-9.e-]+s: 3\n")
        assert walk.idle_stats("celery")["ACTIVE"] == "0"  # settled: the one copy stored ran
        # "on a queue as kombu creates it, the worker would run the task twice": two copies stored
        walk.shell(
            ".venv/bin/oncebus fault arm lost-ack --entity celery-plain\n"
            ".venv/bin/python -c 'from tasks import add; add.apply_async((1, 2), queue=\"celery-plain\")'"
        )
        stats = stats_row(walk.shell(".venv/bin/oncebus stats celery-plain"), "celery-plain")
        assert (stats["DEDUP"], stats["ACCEPTED"], stats["ACTIVE"]) == ("off", "2", "2"), stats

        # "only a resend of the same attempt is dropped": a retry of invoice-42 (retries=1, as self.retry() sends)
        walk.shell(
            ".venv/bin/python -c 'from tasks import add; add.apply_async((2, 3), task_id=\"invoice-42\", retries=1)'",
            "a retry",
        )
        worker.wait_for(r"Task tasks\.add\[invoice-42\] succeeded", count=2)

        # an unchanged app: TLS on 5671 with the CA in (a copy of) certifi's bundle, the SDK's random MessageIds
        bundle = walk.run(walk.take('cat .oncebus/tls/ca.pem >> "$(.venv/bin/python -m certifi)"', "sh"))
        assert bundle == ""
        assert (copy / "certifi" / "cacert.pem").read_text().endswith((folder / ".oncebus/tls/ca.pem").read_text())
        walk.run(walk.take('app.send_task("tasks.add", (2, 3), task_id="invoice-43")', "python"))
        worker.wait_for(r"Task tasks\.add\[invoice-43\] succeeded", count=2)
        walk.finish()

        # "It still drops the SDK's own resend after a lost acknowledgement"
        url = re.findall(r'broker="([^"]+)"', (folder / "plain.py").read_text())[0]
        (folder / "again.py").write_text(
            f"from celery import Celery\n\nCelery('again', broker={url!r}).send_task('tasks.add', (5, 5))\n"
        )
        walk.shell(".venv/bin/oncebus fault arm lost-ack --entity celery\n.venv/bin/python again.py")
        worker.wait_for(r"succeeded in [0-9.e-]+s: 10\n")
        stats = walk.idle_stats("celery")
        assert (stats["ACCEPTED"], stats["DUPLICATES"], stats["ACTIVE"]) == ("6", "3", "0"), stats
        output = worker.output()
        assert output.count("Task tasks.add[invoice-42] succeeded") == 2, output  # the first send and its retry
        for result in (3, 10):  # each lost acknowledgement's task, once
            assert len(re.findall(rf"succeeded in [0-9.e-]+s: {result}\n", output)) == 1, output
    finally:
        walk.stop()
