"""``rhumbatron up`` and ``make up``: the embedded stack, the operator API and a live
dashboard on loopback, with every role of the template running on its schedule.

One process, one event loop:

* the embedded stack (:class:`~rhumbatron_dev.local.stack.LocalStack`): nats-server and moto's
  S3 server on loopback, the JetStream store and the SQLite state under ``root``; both are
  kept between runs (``make clean`` removes them);
* the operator API and the dashboard (:mod:`rhumbatron_dev.dashboard`) under uvicorn on
  ``127.0.0.1``, with a static API token made for this run only (every scope, every tenant),
  printed with the dashboard's address;
* the roles, in place of the Lambdas and their schedules (``template.yaml``):

  - the **sweep** at the start of every minute (``rate(1 minute)``), the sweep function's
    own tick: the router's sweep of the minute's stream, the lag and backlog metrics, the
    dead-letter queue, the lifecycle's housekeeping;
  - the **outbox publisher's scan** of due alarms, every minute (``rate(1 minute)``);
  - the **outbox publisher's alarm invokes**: an actor that writes announces its alarm, and
    the alarm fires within ``alarm_check_every_s`` (an asynchronous invoke in the cloud);
  - the **router nudges**, which the publisher starts in the background for every stream it
    published to (:class:`~rhumbatron.router.nudge.InProcessNudge`);
  - each **queue's consumer**, polling its queue every ``queue_poll_every_s`` with its
    handler, the dead-letter queue's consumer included (as
    :meth:`~rhumbatron_dev.local.loop.LocalLoop.one_round` does).

  The roles run one after another, never two at once (but for the router nudges, which the
  router's own locks keep apart), as :class:`~rhumbatron_dev.local.loop.LocalLoop`
  plays them. Each tick is counted with its duration and error for the dashboard's
  functions panel (:class:`~rhumbatron_dev.dashboard.stats.LocalRunStats`); a tick that fails
  is logged and the schedule goes on, as the next invocation of a Lambda would.

The API has a runtime of its own, as its own process would have; the dashboard reads
through it. It runs until Ctrl-C, or for ``duration_s``.

Exit status: 0 stopped (Ctrl-C, or the duration ran out); 1 a setting that cannot work (a
``RHUMBATRON_API_TOKENS`` that is not JSON, ...), said in one line naming the variable and
checked before anything starts, is created or binds a port; or the stack failed to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.settings import ANY_TENANT, load_settings
from rhumbatron.errors import ConfigurationError, RhumbatronError
from rhumbatron_dev.dashboard.stats import LocalRunStats
from rhumbatron_dev.local.loop import LOOP_QUEUES

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["UpHandle", "UpSchedule", "main", "run_up"]

#: Where `rhumbatron up` keeps its state and NATS store between runs (the demo uses a folder
#: of its own under it, which it wipes).
DEFAULT_ROOT = Path(".rhumbatron")

_log = logging.getLogger(__name__)

#: How long a stop waits for the tick in progress before cancelling it.
_STOP_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class UpSchedule:
    """How often ``up`` plays each role. The minute schedules are the template's; the
    others stand in for what the cloud does on demand (an alarm's invoke, a consumer's
    poll)."""

    #: The sweep function's schedule (``rate(1 minute)``), at the start of each minute.
    sweep_every_s: float = 60.0
    #: The outbox publisher's ``fire_due_alarms`` schedule (``rate(1 minute)``).
    scan_every_s: float = 60.0
    #: How often each queue's consumer polls its queue while the queues are quiet.
    queue_poll_every_s: float = 1.0
    #: How soon an announced actor alarm fires (the cloud's asynchronous invoke).
    alarm_check_every_s: float = 0.2
    #: Batches one poll of a queue fetches at most, so one busy queue cannot starve the rest.
    queue_max_fetches: int = 5

    def __post_init__(self) -> None:
        for name in ("sweep_every_s", "scan_every_s", "queue_poll_every_s", "alarm_check_every_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(
                    f"UpSchedule.{name}={value!r} must be a positive number of seconds"
                )
        if self.queue_max_fetches < 1:
            raise ValueError(
                f"UpSchedule.queue_max_fetches={self.queue_max_fetches!r} must be >= 1"
            )


@dataclass
class UpHandle:
    """A running ``up``, as ``on_ready`` gets it."""

    #: The roles' runtime (the publisher, the router, the queue consumers).
    app: Rhumbatron
    #: The operator API's runtime (the API's routes and the dashboard read through it).
    api_runtime: Rhumbatron
    #: The API's base address, ``http://127.0.0.1:<port>``.
    url: str
    #: This run's API token: every scope, every tenant.
    token: str
    stats: LocalRunStats
    _stop: asyncio.Event = field(repr=False)

    @property
    def dashboard_url(self) -> str:
        return f"{self.url}/dashboard"

    def stop(self) -> None:
        """Ask ``up`` to stop (as Ctrl-C does): the tick in progress ends, then everything
        shuts down."""
        self._stop.set()


async def run_up(
    root: Path,
    *,
    api_port: int | None = None,
    duration_s: float | None = None,
    on_ready: Callable[[UpHandle], None] | None = None,
    settings_overrides: Mapping[str, Any] | None = None,
    schedule: UpSchedule | None = None,
    out: TextIO | None = None,
) -> LocalRunStats:
    """Run the local stack, the API, the dashboard and the roles under ``root`` until
    Ctrl-C, :meth:`UpHandle.stop` or ``duration_s`` seconds; return the roles' counters.

    ``api_port`` None takes a free port. ``on_ready`` is called once everything listens and
    before the roles' first tick, so a caller can configure the lifecycle first (a test's
    failing apps). ``settings_overrides`` are passed to
    :func:`~rhumbatron.core.settings.load_settings` over the environment (tests shorten
    the retry delays). The addresses and the token are printed to ``out`` (stdout).
    """
    from rhumbatron.api.auth import SCOPES
    from rhumbatron.router.nudge import InProcessNudge
    from rhumbatron.runtime.bootstrap import bootstrap
    from rhumbatron_dev.local.stack import LocalStack

    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s={duration_s!r} must be a positive number of seconds")
    schedule = schedule or UpSchedule()
    # A token for this run only: printed for the operator, written into the dashboard page.
    token = secrets.token_urlsafe(24)
    # Listen before anything else: a port already taken fails before a server starts.
    listener = _listen(api_port)
    port = int(listener.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    # From before the stack starts until after it has stopped: a SIGTERM at any point stops
    # it through its cleanup (the first one; one more while it stops changes nothing).
    stop = asyncio.Event()
    stopped_by_sigterm = _stop_on_sigterm(stop)
    try:
        with LocalStack(root) as stack:
            assert stack.s3 is not None
            settings = load_settings(
                **{
                    "state_dir": root / "state",
                    "nats_url": stack.nats.url,
                    "s3_endpoint_url": stack.s3.endpoint_url,
                    "api_auth_mode": "static",
                    "api_tokens": {token: {"tenant": ANY_TENANT, "scopes": sorted(SCOPES)}},
                    # The dashboard's Change timelines, unless the environment says otherwise.
                    **({} if "RHUMBATRON_TRACE_SPANS" in os.environ else {"trace_spans": True}),
                    **(settings_overrides or {}),
                }
            )
            nudge = InProcessNudge()
            app = bootstrap(settings, alarms=RecordingAlarmSink(), nudge=nudge)
            stats = LocalRunStats(app.clock)
            try:
                await app.ensure_streams()
                stack.s3.client().create_bucket(Bucket=settings.evidence_bucket)
                handle = UpHandle(
                    app, bootstrap(settings, alarms=app.alarms), url, token, stats, stop
                )
                async with _serving(handle, listener, port):
                    _announce(
                        handle, stack.nats.url, stack.s3.endpoint_url, schedule, out or sys.stdout
                    )
                    if on_ready is not None:
                        on_ready(handle)
                    # After on_ready: building the router builds the lifecycle it routes to.
                    app.router()  # binds the nudge: the publisher's first nudge finds it
                    await _run_until_stopped(_Roles(app, schedule, stats, stop), stop, duration_s)
            finally:
                # Nudges still running use the router, which closing the runtime closes.
                await nudge.close()
                await app.close()
    finally:
        listener.close()
        if stopped_by_sigterm:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
    return stats


def _stop_on_sigterm(stop: asyncio.Event) -> bool:
    """SIGTERM (kill, a process manager, ``timeout``) stops the stack as ``stop`` does, its
    cleanup included; whether it could be set up (only the main thread can). uvicorn takes
    SIGTERM over while it serves, and raises it again once it has stopped: it then comes
    here. Left to its default, it ended the process before the cleanup and orphaned the
    stack's nats-server. Ctrl-C already stops through asyncio.run."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    except (ValueError, RuntimeError, NotImplementedError):
        return False
    return True


def _listen(port: int | None) -> socket.socket:
    """The API's socket on loopback, listening before uvicorn runs: a request that comes
    first waits in the backlog until uvicorn accepts it."""
    try:
        return socket.create_server(("127.0.0.1", port or 0))
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on 127.0.0.1:{port}: {exc}; pick another port (--port) or stop "
            "what holds it"
        ) from exc


@contextlib.asynccontextmanager
async def _serving(handle: UpHandle, listener: socket.socket, port: int) -> AsyncIterator[None]:
    """The API and the dashboard under uvicorn on ``listener``, on this event loop; stopped
    (and the API's runtime closed by its lifespan) on exit."""
    import uvicorn

    from rhumbatron.api import authenticator_from_settings, create_api
    from rhumbatron_dev.dashboard import dashboard_router

    runtime = handle.api_runtime
    auth = authenticator_from_settings(runtime.settings, runtime.clock)
    api = create_api(runtime, auth)
    api.include_router(
        dashboard_router(
            runtime,
            token=handle.token,
            auth=auth,
            allowed_hosts=(f"127.0.0.1:{port}", f"localhost:{port}"),
            stats=handle.stats,
        )
    )
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    # The server stopping on its own (Ctrl-C: uvicorn catches it) stops the run too.
    serving.add_done_callback(lambda _: handle.stop())
    try:
        yield
    finally:
        server.should_exit = True
        await serving


def _announce(
    handle: UpHandle, nats_url: str, s3_url: str, schedule: UpSchedule, out: TextIO
) -> None:
    settings = handle.app.settings
    for line in (
        f"rhumbatron up: dashboard {handle.dashboard_url}",
        f"  API       {handle.url}  (OpenAPI {handle.url}/openapi.json, docs {handle.url}/docs)",
        f"  token     {handle.token}",
        "            (static, this run only; every scope, every tenant: "
        "Authorization: Bearer <token>)",
        f"  NATS {nats_url}  S3 {s3_url}  state {settings.state_dir}",
        f"  roles     sweep every {schedule.sweep_every_s:g} s, publisher scan every "
        f"{schedule.scan_every_s:g} s, queues every {schedule.queue_poll_every_s:g} s",
        "  Ctrl-C stops",
    ):
        print(line, file=out, flush=True)


async def _run_until_stopped(roles: _Roles, stop: asyncio.Event, duration_s: float | None) -> None:
    running = asyncio.create_task(roles.run())
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait(
            {running, stopping}, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED
        )
        if running in done:
            running.result()  # the roles' loop never ends by itself: surface why it did
    finally:
        stop.set()
        stopping.cancel()
        # The tick in progress ends first: a queue message half handled would wait out its
        # ack wait before another poll could take it.
        try:
            await asyncio.wait_for(running, _STOP_GRACE_S)
        except TimeoutError:
            _log.warning("a role's tick did not end within %g s; cancelled", _STOP_GRACE_S)


@dataclass
class _Roles:
    """Every role on its schedule, one tick at a time (see the module docstring)."""

    app: Rhumbatron
    schedule: UpSchedule
    stats: LocalRunStats
    stop: asyncio.Event

    async def run(self) -> None:
        s = self.schedule
        now_s = self._now_s()
        # The minute jobs tick at once for the current minute (a restart resumes the
        # workflows and publishes what an earlier run left), then at each minute's start.
        next_sweep = _period_start(now_s, s.sweep_every_s)
        next_scan = _period_start(now_s, s.scan_every_s)
        next_poll = time.monotonic()
        while not self.stop.is_set():
            moved = await self._invoke_alarms()
            now_s = self._now_s()
            if now_s >= next_sweep:
                await self._sweep(datetime.fromtimestamp(next_sweep, UTC))
                next_sweep = _period_start(self._now_s(), s.sweep_every_s) + s.sweep_every_s
            if now_s >= next_scan:
                await self._scan()
                next_scan = _period_start(self._now_s(), s.scan_every_s) + s.scan_every_s
            if moved or time.monotonic() >= next_poll:
                moved += await self._poll_queues()
                next_poll = time.monotonic() + s.queue_poll_every_s
            if moved:
                continue  # work flows: the next hop goes at once
            until_minute_jobs = min(next_sweep, next_scan) - self._now_s()
            until_poll = next_poll - time.monotonic()
            await self._idle(min(s.alarm_check_every_s, until_poll, until_minute_jobs))

    def _now_s(self) -> float:
        return self.app.clock.now().timestamp()

    async def _idle(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _tick(self, role: str, work: Callable[[], Awaitable[int]]) -> int:
        """One tick of ``role``, counted with its duration; a failure is counted and logged,
        and the schedule goes on (the next invocation tries again)."""
        started = time.monotonic()
        # The nudges run in the background; their count is read at each tick.
        self.stats.router_nudges = getattr(self.app.nudge, "runs", 0)
        try:
            moved = await work()
        except Exception as exc:  # every failure of a tick is the tick's, not up's
            error = f"{type(exc).__name__}: {exc}"
            self.stats.tick(role, time.monotonic() - started, error=error)
            _log.warning("%s tick failed: %s", role, error)
            return 0
        self.stats.tick(role, time.monotonic() - started, items=moved)
        return moved

    async def _invoke_alarms(self) -> int:
        alarms = self.app.alarms
        # No announcement, no invoke: the cloud invokes the publisher only for an alarm.
        if not (isinstance(alarms, RecordingAlarmSink) and alarms.announced):
            return 0

        async def work() -> int:
            return self.stats.record_publish(await self.app.drain_alarms())

        return await self._tick("outbox-publisher", work)

    async def _scan(self) -> int:
        async def work() -> int:
            scan = await self.app.fire_due_alarms(rotate=True)
            return self.stats.record_publish(scan.reports)

        return await self._tick("outbox-publisher-scan", work)

    async def _sweep(self, at: datetime) -> int:
        # The sweep function's own tick, with the minute it was scheduled for.
        from rhumbatron.entrypoints.sweep import _handle

        async def work() -> int:
            summary = await _handle(self.app, None, at=at)
            return int(summary["totals"]["applied"]) + int(summary["dead_letter_queue"]["recorded"])

        return await self._tick("sweep", work)

    async def _poll_queues(self) -> int:
        from rhumbatron.queues.dead_letter import DeadLetterConsumer

        moved = 0
        for queue in LOOP_QUEUES:
            if self.stop.is_set():
                break

            async def work(queue: str = queue) -> int:
                runtime = await self.app.queue_runtime()
                fetches = self.schedule.queue_max_fetches
                if queue == "dead-letter":
                    consumer = DeadLetterConsumer(self.app)
                    report = await runtime.poll(
                        queue, consumer, max_fetches=fetches, on_undecodable=consumer.on_undecodable
                    )
                else:
                    handler = self.app.lifecycle().handler(queue)
                    report = await runtime.poll(queue, handler, max_fetches=fetches)
                return self.stats.record_poll(report)

            moved += await self._tick(f"queue:{queue}", work)
        return moved


def _period_start(now_s: float, period_s: float) -> float:
    """The start of the period ``now_s`` falls in (the minute, for 60 s)."""
    return now_s - now_s % period_s


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rhumbatron up`` and ``make up``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="rhumbatron up",
        description="The embedded stack, the operator API and a live dashboard on 127.0.0.1, "
        "with every role running on the template's schedules; Ctrl-C stops.",
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--port", type=int, default=None, help="the API's port (default: free)")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # nats-py logs every failed reconnect with a traceback; the roles' ticks say it once each.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    try:
        # The environment's settings are checked before anything starts or is created: a bad
        # RHUMBATRON_API_TOKENS is one line, not a traceback from inside the stack.
        load_settings()
    except RhumbatronError as exc:
        print(f"rhumbatron up: {exc}", file=sys.stderr)
        return 1
    try:
        asyncio.run(run_up(args.root, api_port=args.port, duration_s=args.duration))
    except KeyboardInterrupt:
        # uvicorn stops on Ctrl-C and raises it again; the stop was asked for.
        pass
    except RhumbatronError as exc:
        print(f"rhumbatron up: {exc}", file=sys.stderr)
        return 1
    print("rhumbatron up: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
