"""``bench/amqp_floor.py``'s in-process rows (the broker alone, the send's necessary parts) still run: issue 16's
note reads its goals' bounds from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_broker_alone_sends_receives_and_completes_every_message() -> None:
    command = [sys.executable, str(ROOT / "bench" / "amqp_floor.py"), "--broker-alone", "400"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(measured) == ["check", "decode", "judge", "receive", "receive_loop", "send", "send_loop"]
    assert all(value > 0 for value in measured.values()), measured
    assert measured["send_loop"] <= measured["send"] and measured["receive_loop"] <= measured["receive"] * 1.05
