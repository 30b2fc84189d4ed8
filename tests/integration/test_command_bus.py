"""One command at a time, as :class:`CommandBus.send` publishes it, against a real
nats-server: each way a send fails is named for what it is, with the command, its queue and
what to do: refused by JetStream (the message reached a stream that is not ``COMMANDS``), or
not taken in time (send it again: its message ID makes a repeat harmless)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest

from rhumbatron.errors import MessagingError, NatsUnavailableError
from rhumbatron.messaging.commands import CommandBus
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.tracecontext import TraceContext, change_trace_id
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration


def _wake(command_id: str) -> Command:
    return Command.create(
        command_id=command_id,
        command_type="agent.wake",
        project_id="acme-web",
        created_at=datetime(2026, 12, 3, tzinfo=UTC),
        payload={"agentId": "agent-1", "reason": "task.ready"},
    )


async def test_a_command_another_stream_would_take_is_refused_naming_it_and_the_code(
    nats_server: NatsServerProcess,
) -> None:
    # GIVEN no COMMANDS stream, and another stream that binds the command subjects
    client = await nats.connect(nats_server.url)
    try:
        await client.jetstream().add_stream(name="ELSEWHERE", subjects=["cmd.>"])
        bus = CommandBus(client, ack_timeout_s=5)
        # WHEN a command is sent, THEN JetStream refuses it (it expects COMMANDS), and the
        #   error names the command, the queue, the reason and the code; nothing is stored
        with pytest.raises(MessagingError) as refused:
            await bus.send("integration", _wake("cmd_refused_1"))
        assert not isinstance(refused.value, NatsUnavailableError)
        assert str(refused.value) == (
            "JetStream refused command cmd_refused_1 on integration: expected stream does not "
            "match (code 10060)"
        )
        assert (await client.jetstream().stream_info("ELSEWHERE")).state.messages == 0
        # AND a raw body (a record that never decoded, on its way to the dead letters) is
        #   named by the message ID it was sent under
        with pytest.raises(MessagingError) as refused_raw:
            await bus.send_raw("dead-letter", b"not a command", message_id="dlq_raw_1")
        assert str(refused_raw.value) == (
            "JetStream refused command dlq_raw_1 on dead-letter: expected stream does not "
            "match (code 10060)"
        )
    finally:
        await client.close()


async def test_a_command_whose_ack_does_not_come_in_its_time_says_to_send_it_again(
    tmp_path: Path,
) -> None:
    # GIVEN the COMMANDS stream, a bus whose sends wait 0.3 s for the PubAck (the JetStream
    # context's own default is 5 s), and then a server that stalls (SIGSTOP)
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    client = await nats.connect(server.url, allow_reconnect=False)
    try:
        await client.jetstream().add_stream(name=COMMAND_STREAM, subjects=["cmd.>"])
        bus = CommandBus(client, ack_timeout_s=0.3)
        server.pause()
        # WHEN a command is sent, THEN it gives up after its own 0.3 s, not the context's 5 s,
        #   naming the command, the queue and what to do
        started = time.monotonic()
        with pytest.raises(NatsUnavailableError) as unsent:
            await bus.send("integration", _wake("cmd_stalled_1"))
        assert time.monotonic() - started < 3
        assert str(unsent.value) == (
            "cannot send command cmd_stalled_1 to integration: TimeoutError: nats: timeout; "
            "send it again (its message ID makes a repeat harmless)"
        )
    finally:
        server.resume()
        await client.close()
        server.stop()


async def test_a_command_sent_outside_any_span_carries_its_changes_trace_or_the_one_given(
    nats_server: NatsServerProcess,
) -> None:
    # GIVEN the COMMANDS stream, and a command about a Change
    client = await nats.connect(nats_server.url)
    try:
        js = client.jetstream()
        await js.add_stream(name=COMMAND_STREAM, subjects=["cmd.>"])
        bus = CommandBus(client, ack_timeout_s=5)
        about_a_change = _wake("cmd_traced_1").model_copy(update={"change_id": "chg-1"})
        given = TraceContext.parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        # WHEN it is sent with no span in progress, and another with a trace given
        first = await bus.send("integration", about_a_change)
        second = await bus.send("integration", _wake("cmd_traced_2"), trace=given)
        # THEN the first's traceparent is in its Change's trace; the second's is the one given
        header = (await js.get_msg(COMMAND_STREAM, first.stream_seq)).headers or {}
        assert TraceContext.parse(header["traceparent"]).trace_id == change_trace_id(
            "acme-web", "chg-1"
        )
        header = (await js.get_msg(COMMAND_STREAM, second.stream_seq)).headers or {}
        assert given is not None and header["traceparent"] == given.header
    finally:
        await client.close()
