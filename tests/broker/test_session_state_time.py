"""The time a session state was set is stored with it: ``get-message-sessions`` with a last-updated time answers
the same after a restart as before it."""

from __future__ import annotations

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.timeutil import us_to_datetime
from tests.broker.conftest import StoreFactory, run


def test_a_session_state_keeps_the_time_it_was_set_across_a_restart(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("s", requires_session=True)
        await ns.send("s", [Message(b"1", session_id="early"), Message(b"2", session_id="late")])
        early = await ns.accept_session("s", "early")
        t_early = clock.now_us()
        await ns.set_session_state(early, b"e")
        clock.advance(5)
        late = await ns.accept_session("s", "late")
        t_late = clock.now_us()
        await ns.set_session_state(late, b"l")
        await ns.close()

        clock.advance(10)  # the restart, after both were set
        ns = await Namespace.open(stores.open(), clock)
        before_early = us_to_datetime(t_early - 1)
        between = us_to_datetime(t_early + 1_000_000)  # after "early" was set, before "late"
        after_both = us_to_datetime(t_late + 1_000_000)  # before the restart
        assert ns.list_sessions("s", state_updated_after=before_early) == ["early", "late"]
        assert ns.list_sessions("s", state_updated_after=between) == ["late"]
        assert ns.list_sessions("s", state_updated_after=after_both) == []
        assert ns.list_sessions("s") == ["early", "late"]
        again = await ns.accept_session("s", "early")
        assert await ns.get_session_state(again) == b"e"
        clock.advance(1)
        await ns.set_session_state(again, b"e2")  # set again: its new time
        assert ns.list_sessions("s", state_updated_after=after_both) == ["early"]
        await ns.close()

    run(go())
