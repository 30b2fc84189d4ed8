"""Reading a node's copies from its monitor (issue #18) never waits on a node longer than its
timeout, 2 s unless told: not on one that takes the connection and never answers, nor on one
that answers who it is and then never sends its ``/jsz``."""

from __future__ import annotations

import asyncio
import time

from rhumbatron.messaging.log_state import read_replica_states
from unresponsive_monitors import monitor_stuck_on_jsz, silent_monitor


async def test_a_node_that_never_sends_its_jsz_is_named_unread_within_the_timeout() -> None:
    with monitor_stuck_on_jsz() as stuck:
        states, unread = await asyncio.wait_for(
            asyncio.to_thread(read_replica_states, [stuck], ["EVENTS_00"], timeout_s=0.5),
            10,  # a read that waits on /jsz for ever fails here
        )
    assert states == []
    assert len(unread) == 1 and unread[0].startswith(f"{stuck} (")


async def test_a_silent_node_is_given_up_on_after_2_s_unless_told() -> None:
    with silent_monitor() as silent:
        started = time.monotonic()
        states, unread = await asyncio.wait_for(
            asyncio.to_thread(read_replica_states, [silent], ["EVENTS_00"]), 10
        )
        waited = time.monotonic() - started
    assert (states, len(unread)) == ([], 1)
    # its /varz read timed out after the default 2 s (with room for a loaded machine)
    assert 2.0 <= waited < 2.9, f"gave up after {waited:.2f} s"
