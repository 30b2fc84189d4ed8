"""``ensure_streams`` against a real nats-server (spec "Transactional outbox": 8 streams
EVENTS_00..07 on events.00..07, 7 days, limits, file, 2-hour duplicate window; "Queues": one
work-queue stream COMMANDS on cmd.<queue>, 14 days, 2-hour window)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import StreamConfigError
from rhumbatron.messaging.streams import COMMAND_STREAM, ensure_streams, wanted_streams
from rhumbatron.protocol.command_types import QUEUES
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

EVENT_STREAMS = [f"EVENTS_0{i}" for i in range(8)]
ALL_STREAMS = [*EVENT_STREAMS, COMMAND_STREAM]
DAY_S = 86_400


@pytest_asyncio.fixture
async def js(nats_server: NatsServerProcess) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream()
    await nc.close()


async def configs(js: JetStreamContext) -> dict[str, Any]:
    return {name: (await js.stream_info(name)).config for name in ALL_STREAMS}


async def test_ensure_streams_creates_the_eight_event_streams_as_the_spec_says(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN an empty JetStream
    # WHEN core starts and ensures its streams
    report = await ensure_streams(js, settings)
    # THEN EVENTS_00..07 exist, each on its one subject, as the spec configures them
    assert report.created == ALL_STREAMS
    found = await configs(js)
    for index, name in enumerate(EVENT_STREAMS):
        config = found[name]
        assert config.subjects == [f"events.0{index}"]
        assert config.retention == RetentionPolicy.LIMITS
        assert config.storage == StorageType.FILE
        assert config.max_age == 7 * DAY_S
        assert config.duplicate_window == 2 * 3600
        assert config.allow_atomic is True
        assert config.allow_batched is True
        assert config.num_replicas == 1


async def test_ensure_streams_creates_the_commands_work_queue(
    js: JetStreamContext, settings: Settings
) -> None:
    await ensure_streams(js, settings)
    config = (await js.stream_info(COMMAND_STREAM)).config
    # one subject cmd.<queue> per queue, work-queue retention, 14 days, 2-hour window
    assert sorted(config.subjects) == sorted(f"cmd.{queue}" for queue in QUEUES)
    assert config.retention == RetentionPolicy.WORK_QUEUE
    assert config.storage == StorageType.FILE
    assert config.max_age == 14 * DAY_S
    assert config.duplicate_window == 2 * 3600


async def test_ensure_streams_again_changes_nothing(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN the streams exist
    await ensure_streams(js, settings)
    before = await configs(js)
    # WHEN start-up runs again
    report = await ensure_streams(js, settings)
    # THEN every stream is reported unchanged and its configuration is the same
    assert report.created == []
    assert report.updated == {}
    assert report.unchanged == ALL_STREAMS
    assert await configs(js) == before


async def test_a_stream_with_another_duplicate_window_is_updated(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN streams made earlier with a 10-minute duplicate window
    await ensure_streams(js, load_settings(state_dir=settings.state_dir, duplicate_window_s=1800))
    assert (await js.stream_info("EVENTS_05")).config.duplicate_window == 1800
    # WHEN start-up ensures them with the default 2-hour window
    report = await ensure_streams(js, settings)
    # THEN each stream is updated in place, naming the difference
    assert report.updated == {name: ["duplicate_window"] for name in ALL_STREAMS}
    assert {c.duplicate_window for c in (await configs(js)).values()} == {2 * 3600}


async def test_event_streams_made_before_fast_batches_are_updated_to_allow_them(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN the event streams as an older version made them, without fast-ingest batches
    for config in wanted_streams(settings):
        config.allow_batched = None
        await js.add_stream(config)
    # WHEN start-up ensures them
    report = await ensure_streams(js, settings)
    # THEN each event stream is updated in place to allow them; COMMANDS never needed them
    assert report.updated == {name: ["allow_batched"] for name in EVENT_STREAMS}
    found = await configs(js)
    assert all(found[name].allow_batched for name in EVENT_STREAMS)


async def test_streams_that_say_the_same_settings_another_way_are_left_unchanged(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN the streams made by another tool: subjects in another order, the replica count
    #   left to the server's default, durations off by under a millisecond
    for config in wanted_streams(settings):
        assert config.subjects and config.max_age and config.duplicate_window
        config.subjects = list(reversed(config.subjects))
        config.num_replicas = None
        config.max_age += 0.0004
        config.duplicate_window += 0.0004
        await js.add_stream(config)
    # WHEN start-up ensures them, THEN each is what it wants: none is updated
    report = await ensure_streams(js, settings)
    assert (report.created, report.updated) == ([], {})
    assert report.unchanged == ALL_STREAMS


async def test_a_stream_whose_max_age_is_off_by_part_of_a_second_is_updated(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN EVENTS_02 made with a max age 0.4 s short of the 7 days
    [config] = [c for c in wanted_streams(settings) if c.name == "EVENTS_02"]
    assert config.max_age is not None
    config.max_age -= 0.4
    await js.add_stream(config)
    # WHEN start-up ensures the streams, THEN it is set to the 7 days, naming the difference
    report = await ensure_streams(js, settings)
    assert report.updated == {"EVENTS_02": ["max_age"]}
    assert (await js.stream_info("EVENTS_02")).config.max_age == 7 * DAY_S


async def test_streams_wanted_on_three_replicas_are_not_taken_as_they_are_on_one(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN the streams on this one server, one replica each
    await ensure_streams(js, settings)
    # WHEN a deployment that wants three replicas ensures them
    three = load_settings(state_dir=settings.state_dir, stream_replicas=3)
    # THEN the replica count is a difference to fix, which one server cannot: start-up stops
    #   naming the stream, not reporting it unchanged
    with pytest.raises(StreamConfigError, match=r"^JetStream refused to update stream EVENTS_00"):
        await ensure_streams(js, three)


def test_a_deployment_on_three_replicas_wants_every_stream_on_three(settings: Settings) -> None:
    # GIVEN a deployment that sets three replicas (a cluster's)
    three = load_settings(state_dir=settings.state_dir, stream_replicas=3)
    # THEN every stream it wants, the eight event streams and COMMANDS, is on three
    assert {c.name: c.num_replicas for c in wanted_streams(three)} == dict.fromkeys(ALL_STREAMS, 3)


async def test_a_stream_missing_a_subject_gets_it_back(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN COMMANDS made by hand without the dead-letter queue's subject
    subjects = [f"cmd.{q}" for q in QUEUES if q != "dead-letter"]
    await js.add_stream(
        StreamConfig(
            name=COMMAND_STREAM,
            subjects=subjects,
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=14 * DAY_S,
            duplicate_window=7200,
        )
    )
    report = await ensure_streams(js, settings)
    assert report.updated == {COMMAND_STREAM: ["subjects"]}
    assert "cmd.dead-letter" in (await js.stream_info(COMMAND_STREAM)).config.subjects


async def test_a_stream_in_memory_storage_stops_start_up_naming_storage(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN EVENTS_03 created by someone else with memory storage
    await js.add_stream(
        StreamConfig(
            name="EVENTS_03",
            subjects=["events.03"],
            storage=StorageType.MEMORY,
            max_age=7 * DAY_S,
            duplicate_window=7200,
        )
    )
    # WHEN start-up ensures the streams
    # THEN it fails, naming the stream and the setting JetStream cannot change
    with pytest.raises(StreamConfigError) as caught:
        await ensure_streams(js, settings)
    message = str(caught.value)
    assert "EVENTS_03" in message
    assert "storage" in message
    assert "memory" in message
    # AND the stream was left as it was
    assert (await js.stream_info("EVENTS_03")).config.storage == StorageType.MEMORY


async def test_a_stream_with_two_settings_jetstream_cannot_change_names_both(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN EVENTS_04 made by someone else in memory and as a work queue
    await js.add_stream(
        StreamConfig(
            name="EVENTS_04",
            subjects=["events.04"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.MEMORY,
            max_age=7 * DAY_S,
            duplicate_window=7200,
        )
    )
    # WHEN start-up ensures the streams, THEN it stops naming both, each as it is and as wanted
    with pytest.raises(StreamConfigError) as caught:
        await ensure_streams(js, settings)
    assert str(caught.value) == (
        "stream EVENTS_04 exists with settings JetStream cannot change (retention: has "
        "'workqueue', want 'limits', storage: has 'memory', want 'file'); back up and delete "
        "the stream, or point RHUMBATRON_NATS_URL elsewhere"
    )


async def test_a_commands_stream_with_limits_retention_stops_start_up_naming_retention(
    js: JetStreamContext, settings: Settings
) -> None:
    await js.add_stream(
        StreamConfig(
            name=COMMAND_STREAM,
            subjects=[f"cmd.{q}" for q in QUEUES],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
        )
    )
    with pytest.raises(StreamConfigError, match="retention"):
        await ensure_streams(js, settings)


async def test_a_foreign_stream_holding_our_subjects_stops_start_up_naming_both(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN another application's stream that already takes every events.* subject
    await js.add_stream(StreamConfig(name="SOMEONE_ELSE", subjects=["events.>"]))
    # WHEN start-up ensures the streams
    # THEN JetStream's refusal comes back as a StreamConfigError naming our stream,
    # its subject, and what to do
    with pytest.raises(StreamConfigError) as caught:
        await ensure_streams(js, settings)
    message = str(caught.value)
    assert message.startswith(
        "JetStream refused to create stream EVENTS_00 on subjects events.00: "
    )
    assert message.endswith(
        "; if another stream already holds these subjects, remove it or point "
        "RHUMBATRON_NATS_URL at a server of Rhumbatron's own"
    )


async def test_a_foreign_stream_holding_the_command_subjects_is_refused_naming_each(
    js: JetStreamContext, settings: Settings
) -> None:
    # GIVEN another application's stream that already takes every cmd.* subject
    await js.add_stream(StreamConfig(name="SOMEONE_ELSE", subjects=["cmd.>"]))
    # WHEN start-up ensures the streams
    # THEN the event streams are made, and COMMANDS is refused naming every one of its subjects
    with pytest.raises(StreamConfigError) as caught:
        await ensure_streams(js, settings)
    subjects = ", ".join(f"cmd.{queue}" for queue in QUEUES)
    assert str(caught.value).startswith(
        f"JetStream refused to create stream {COMMAND_STREAM} on subjects {subjects}: "
    )
    made = sorted(str(info.config.name) for info in await js.streams_info())
    assert made == sorted([*EVENT_STREAMS, "SOMEONE_ELSE"])
