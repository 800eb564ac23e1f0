"""The dashboard in Debian's headless chromium, driven by Selenium with /usr/bin/chromedriver (no browser download).

Against ``oncebus serve`` (the real SDK sending) and against an in-process broker with
ten minutes of injected traffic: the page loads without console errors, shows the
entities, and its duplicate counter goes up after a resend without a reload. Screenshots
are saved in the tests' temporary directories; with ``ONCEBUS_DASHBOARD_SCREENSHOT=PATH``
the in-process one is also copied there (that is how ``docs/dashboard.png`` is made).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncebus.broker import Message
from tests.cli_support import oncebus
from tests.http.conftest import start_server
from tests.http.observe_server import ObservedBroker

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1640",
]

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them with apt-get)",
)


def _traffic(broker: ObservedBroker) -> int:
    """Ten minutes of sends with resends at various delays, one tick a second; returns orders' duplicates."""
    ns, clock = broker.ns, broker.clock
    rnd = random.Random(11)

    async def go() -> int:
        await ns.create_queue(
            "orders", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT5M"
        )
        await ns.create_topic(
            "events", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M"
        )
        await ns.create_subscription("events", "audit")
        await ns.create_subscription("events", "billing")
        await ns.create_queue("plain")
        sent: list[str] = []
        events: list[str] = []
        for second in range(600):
            clock.advance(1)
            batch = [f"order-{second}-{i}" for i in range(rnd.randint(0, 3))]
            if sent and rnd.random() < 0.4:
                batch.append(rnd.choice(sent[-300:]))  # a resend, up to a few minutes late
            if batch:
                await ns.send("orders", [Message(b"order", message_id=m) for m in batch])
                sent += batch
            if second % 3 == 0:
                event = [f"event-{second}"]
                if events and rnd.random() < 0.5:
                    event.append(rnd.choice(events[-40:]))  # often after the 1-minute window: late resends
                await ns.send("events", [Message(b"event", message_id=e) for e in event])
                events += event
            if second % 10 == 0:
                await ns.send("plain", Message(b"plain"))
            ns.tick()
        for message in await ns.receive("orders", 40):
            await ns.complete("orders", message.lock_token)  # type: ignore[arg-type]
        (bad,) = await ns.receive("orders", 1)
        await ns.dead_letter("orders", bad.lock_token, reason="invalid order")  # type: ignore[arg-type]
        return ns.stats("orders").duplicates_dropped

    return broker.call(go, timeout=120)


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_dashboard_live_in_chromium(tmp_path: Path, chromium: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    driver: WebDriver = chromium  # type: ignore[assignment]
    with ObservedBroker(tmp_path) as broker:
        duplicates = _traffic(broker)
        assert duplicates > 0
        driver.get(broker.url + "/")

        def counter(path: str) -> str:
            found = driver.find_elements(
                By.CSS_SELECTOR, f'article[data-path="{path}"] [data-field="duplicates_dropped"]'
            )
            return found[0].text if found else ""

        WebDriverWait(driver, 20).until(lambda _: counter("orders") == f"{duplicates:,}")
        names = [e.text for e in driver.find_elements(By.CSS_SELECTOR, 'article.entity [data-field="name"]')]
        assert names == ["orders", "events", "plain"]
        assert "duplicate detection PT5M" in driver.find_element(By.CSS_SELECTOR, 'article[data-path="orders"]').text
        assert driver.find_elements(By.CSS_SELECTOR, 'article[data-path="orders"] [data-chart="sends"] svg rect')
        assert driver.find_elements(By.CSS_SELECTOR, 'article[data-path="orders"] [data-chart="delays"] svg rect')
        assert "Window advisor" in driver.find_element(By.CSS_SELECTOR, 'article[data-path="orders"] .advice').text
        driver.execute_script("window.__notReloaded = true;")
        screenshot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(screenshot))

        async def resend() -> None:
            outcome = await broker.ns.send("orders", Message(b"order", message_id="order-599-0"))
            assert outcome[0].duplicate

        broker.call(resend)
        WebDriverWait(driver, 10).until(lambda _: counter("orders") == f"{duplicates + 1:,}")
        assert driver.execute_script("return window.__notReloaded === true;")
        errors = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        assert driver.find_element(By.ID, "status").get_attribute("class") == "status live"

    assert screenshot.stat().st_size > 10_000
    target = os.environ.get("ONCEBUS_DASHBOARD_SCREENSHOT")
    if target:
        shutil.copyfile(screenshot, target)


def _counter(driver: object, path: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(  # type: ignore[attr-defined]
        By.CSS_SELECTOR, f'article[data-path="{path}"] [data-field="duplicates_dropped"]'
    )
    return found[0].text if found else ""


def test_dashboard_on_oncebus_serve(tmp_path: Path, chromium: object) -> None:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    driver: WebDriver = chromium  # type: ignore[assignment]
    served = start_server(tmp_path / "data")
    try:
        for args in (
            ("queue", "create", "orders", "--duplicate-detection", "--window", "PT5M"),
            ("topic", "create", "events"),
        ):
            created = oncebus(*args, data_dir=served.data_dir)
            assert created.returncode == 0, created.stderr
        with ServiceBusClient.from_connection_string(served.connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                sender.send_messages(
                    [ServiceBusMessage("x", message_id="order-1"), ServiceBusMessage("x", message_id="order-1")]
                )
                driver.get(f"http://127.0.0.1:{served.http_port}/")
                WebDriverWait(driver, 20).until(lambda _: _counter(driver, "orders") == "1")
                names = [e.text for e in driver.find_elements(By.CSS_SELECTOR, 'article.entity [data-field="name"]')]
                assert names == ["orders", "events"]
                driver.execute_script("window.__notReloaded = true;")
                sender.send_messages(ServiceBusMessage("x", message_id="order-1"))  # a resend
                WebDriverWait(driver, 10).until(lambda _: _counter(driver, "orders") == "2")
                assert driver.execute_script("return window.__notReloaded === true;")
                namespace = driver.find_element(By.ID, "namespace").text
                assert "1 connections" in namespace, namespace  # this sender's
        errors = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        assert driver.save_screenshot(str(tmp_path / "dashboard-serve.png"))
    finally:
        served.stop()
