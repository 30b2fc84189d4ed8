"""``ensure_consumer`` against a real nats-server: what counts as a change of a durable consumer.

The server answers a consumer's config in its own forms (the ack wait in nanoseconds, an unset
``max_deliver`` as -1, an unset filter as absent). A config that means the same as what the
server holds must be left alone, since an update on every cold start would cost a round trip
per consumer; a config that differs in a field we manage must be applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.client import JetStreamContext

from rhumbatron.errors import MessagingError
from rhumbatron.messaging.pull import ConsumerChange, ensure_consumer
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

STREAM = "ENSURE"
DURABLE = "cursor"


@pytest_asyncio.fixture
async def js(nats_server: NatsServerProcess) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_server.url)
    context = nc.jetstream()
    await context.add_stream(StreamConfig(name=STREAM, subjects=["ensure.>"]))
    yield context
    await nc.close()


def config(**fields: Any) -> ConsumerConfig:
    base: dict[str, Any] = {
        "durable_name": DURABLE,
        "ack_policy": AckPolicy.EXPLICIT,
        "ack_wait": 30.0,
        "max_deliver": 5,
        "max_ack_pending": 100,
        "filter_subject": "ensure.a",
    }
    base.update(fields)
    return ConsumerConfig(**base)


async def test_a_consumer_is_created_then_left_alone_when_nothing_changed(
    js: JetStreamContext,
) -> None:
    assert await ensure_consumer(js, STREAM, config()) is ConsumerChange.CREATED
    assert await ensure_consumer(js, STREAM, config()) is ConsumerChange.UNCHANGED


@pytest.mark.parametrize(
    ("created_with", "ensured_with"),
    [
        # An unset ack wait is the server's 30 s.
        ({"ack_wait": None}, {"ack_wait": 30.0}),
        ({"ack_wait": 30.0}, {"ack_wait": None}),
        # A sub-millisecond difference is the float round trip through nanoseconds, not a change.
        ({"ack_wait": 2.0004}, {"ack_wait": 2.0}),
        # An unset or zero max_deliver is the server's -1: unlimited.
        ({"max_deliver": None}, {"max_deliver": -1}),
        ({"max_deliver": -1}, {"max_deliver": None}),
        ({"max_deliver": -1}, {"max_deliver": 0}),
        # An empty filter is no filter.
        ({"filter_subject": None}, {"filter_subject": ""}),
        # The ack policy given as its wire string is the same policy.
        ({"ack_policy": AckPolicy.EXPLICIT}, {"ack_policy": "explicit"}),
    ],
)
async def test_a_config_that_means_what_the_server_holds_is_unchanged(
    js: JetStreamContext, created_with: dict[str, Any], ensured_with: dict[str, Any]
) -> None:
    await ensure_consumer(js, STREAM, config(**created_with))

    assert await ensure_consumer(js, STREAM, config(**ensured_with)) is ConsumerChange.UNCHANGED


@pytest.mark.parametrize(
    ("created_with", "ensured_with", "field", "server_value"),
    [
        ({"ack_wait": 2.2}, {"ack_wait": 2.4}, "ack_wait", 2.4),
        ({"ack_wait": 30.0}, {"ack_wait": 31.0}, "ack_wait", 31.0),
        ({"max_deliver": 5}, {"max_deliver": 6}, "max_deliver", 6),
        ({"max_deliver": 1}, {"max_deliver": None}, "max_deliver", -1),
        ({"max_deliver": None}, {"max_deliver": 1}, "max_deliver", 1),
        ({"max_ack_pending": 100}, {"max_ack_pending": 200}, "max_ack_pending", 200),
        (
            {"filter_subject": "ensure.a"},
            {"filter_subject": "ensure.b"},
            "filter_subject",
            "ensure.b",
        ),
        ({"filter_subject": None}, {"filter_subject": "ensure.b"}, "filter_subject", "ensure.b"),
    ],
)
async def test_a_managed_field_that_differs_updates_the_consumer(
    js: JetStreamContext,
    created_with: dict[str, Any],
    ensured_with: dict[str, Any],
    field: str,
    server_value: object,
) -> None:
    await ensure_consumer(js, STREAM, config(**created_with))

    assert await ensure_consumer(js, STREAM, config(**ensured_with)) is ConsumerChange.UPDATED
    info = await js.consumer_info(STREAM, DURABLE)
    assert getattr(info.config, field) == server_value


async def test_a_change_jetstream_refuses_names_the_consumer_and_what_to_do(
    js: JetStreamContext,
) -> None:
    # GIVEN a consumer with explicit acks
    await ensure_consumer(js, STREAM, config())
    # WHEN it is ensured with another ack policy, which JetStream never changes in place
    with pytest.raises(MessagingError) as refused:
        await ensure_consumer(js, STREAM, config(ack_policy=AckPolicy.ALL))
    # THEN the refusal says which consumer, what the server said, and what to do
    message = str(refused.value)
    assert message.startswith(f"JetStream refused to update consumer {DURABLE} on {STREAM}: ")
    assert message.endswith(
        "; if its ack or deliver policy changed, delete the consumer (it is recreated at its "
        "next read)"
    )
    assert "(code 10" in message  # the server's own error code, e.g. 10012
    # AND a create that the server refuses says "create", word for word
    with pytest.raises(MessagingError) as refused_create:
        await ensure_consumer(js, STREAM, config(durable_name="other", ack_wait=-1.0))
    assert str(refused_create.value) == (
        f"JetStream refused to create consumer other on {STREAM}: consumer ack wait needs to "
        "be positive (code 10183); if its ack or deliver policy changed, delete the consumer "
        "(it is recreated at its next read)"
    )
