"""The receiving end of a webhook reaction: what a receiver uses to accept Rhumbatron's signed
deliveries (RELIABILITY B1, B2).

Rhumbatron signs every webhook per Standard Webhooks (``agents.signing``): ``webhook-id`` =
``<eventId>:<subscriptionId>``, ``webhook-timestamp``, and one ``v1`` signature per current
secret over the exact body bytes. :class:`WebhookReceiver` checks a request and returns the
pointer it carries (:class:`ReceivedWebhook`), or raises :class:`WebhookRejected` — always
HTTP 401, with a message that says which check failed:

* a missing ``webhook-*`` header, or a timestamp that is not Unix seconds (``headers``);
* a timestamp more than ``tolerance_s`` (300 s) before or after now (``timestamp``);
* no signature matching a secret the receiver holds — a wrong secret, or a body changed on
  the way, even one re-serialised to the same JSON with other bytes (``signature``);
* the very message accepted before (the same ``webhook-id`` and timestamp, so the same
  signature) within the tolerance window: a replay (``replay``);
* a signed body that is not Rhumbatron's pointer JSON (``body``).

**Rotation (B2).** During a rotation the sender signs with both secrets, so a receiver holding
either one (or both) accepts; once the sender has dropped the old secret, a receiver that still
holds only the old one rejects everything until it is given the new one
(:meth:`WebhookReceiver.set_secrets`).

**Retries are not replays.** The sender retries a delivery it has no 2xx for (a timeout
after the receiver took it, say) under the same ``webhook-id`` with a new timestamp and so a
new signature: that one is accepted as a *duplicate* (``ReceivedWebhook.duplicate``). The
receiver answers it 2xx and does not act on it again — otherwise a receiver that was merely
slow would refuse every retry until the delivery became a dead letter. Retries come 5 s,
5 min, 30 min, 2 h, 5 h and 10 h apart: a receiver flags them only while it remembers the ID
(``remember_s``, by default the tolerance window). Give it the whole schedule (63,305 s,
about 17.6 h), or dedupe on ``webhook-id`` in the receiver's own durable store.

**The seen set.** The IDs accepted are remembered for ``remember_s`` past their timestamp
(at least the tolerance window — after it a replay of those bytes fails the timestamp check
anyway) and at most
``seen_capacity`` of them: when it is full the ID that would be forgotten soonest goes first
(a warning is logged; size it above the deliveries expected in one window). A receiver whose
own processing fails after :meth:`~WebhookReceiver.verify` calls
:meth:`~WebhookReceiver.forget`, so that the sender's retry of that ID is accepted.

:class:`~rhumbatron.reactions.local_webhook_receiver.LocalWebhookReceiver` is the same check
behind a loopback HTTP server, for tests and the demo.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from rhumbatron.agents.signing import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    parse_secret,
    verify,
)
from rhumbatron.core.clock import Clock
from rhumbatron.errors import (
    ConfigurationError,
    WebhookRejected,
    WebhookSecretError,
    WebhookSignatureError,
)

__all__ = [
    "DEFAULT_SEEN_CAPACITY",
    "DEFAULT_TOLERANCE_S",
    "POINTER_FIELDS",
    "PointerSubject",
    "ReceivedWebhook",
    "RejectionReason",
    "WebhookReceiver",
]

_log = logging.getLogger(__name__)

#: Standard Webhooks' tolerance, and ``Settings.webhook_tolerance_s``'s default.
DEFAULT_TOLERANCE_S = 300
#: IDs remembered at most: far above the deliveries one endpoint takes in five minutes.
DEFAULT_SEEN_CAPACITY = 10_000
#: The pointer body's fields (``deliveries.pointer_body``); more may be added compatibly.
POINTER_FIELDS = ("eventId", "kind", "subject", "projectId", "link")


class RejectionReason(StrEnum):
    """Which check a rejected webhook failed."""

    HEADERS = "headers"
    TIMESTAMP = "timestamp"
    SIGNATURE = "signature"
    REPLAY = "replay"
    BODY = "body"


@dataclass(frozen=True, slots=True)
class PointerSubject:
    """What the event is about: ``type`` (task, change, resource ...) and its ID."""

    type: str
    id: str | None


@dataclass(frozen=True, slots=True)
class ReceivedWebhook:
    """An accepted delivery: the pointer body's fields and the signed headers' values.

    ``subscription_id`` is the part of ``webhook_id`` after ``<eventId>:``.
    """

    webhook_id: str
    timestamp: int
    event_id: str
    kind: str
    subject: PointerSubject
    project_id: str
    link: str
    subscription_id: str
    #: Accepted before under another timestamp: the sender's retry. Answer 2xx, act once.
    duplicate: bool = False


class _SeenIds:
    """Accepted IDs with the Unix second after which each is forgotten; bounded."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._until: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []  # (until_s, id); stale entries are skipped

    def __len__(self) -> int:
        return len(self._until)

    def until(self, webhook_id: str) -> int | None:
        return self._until.get(webhook_id)

    def prune(self, now_s: int) -> None:
        while self._heap and self._heap[0][0] < now_s:
            self._pop()

    def add(self, webhook_id: str, until_s: int) -> None:
        while len(self._until) >= self._capacity and self._heap:
            evicted = self._pop()
            if evicted is not None:
                _log.warning(
                    "the webhook receiver's seen set is full (%d IDs): forgot %s early; a "
                    "replay of it would no longer be caught (raise seen_capacity)",
                    self._capacity,
                    evicted,
                )
        self._until[webhook_id] = until_s
        heapq.heappush(self._heap, (until_s, webhook_id))
        if len(self._heap) > 2 * self._capacity:
            # forget() leaves stale heap entries behind: rebuild so the heap stays bounded.
            self._heap = [(until, i) for i, until in self._until.items()]
            heapq.heapify(self._heap)

    def discard(self, webhook_id: str) -> None:
        self._until.pop(webhook_id, None)

    def _pop(self) -> str | None:
        """Drop the heap's first entry; the ID it forgot, or None for a stale entry."""
        until_s, webhook_id = heapq.heappop(self._heap)
        if self._until.get(webhook_id) == until_s:
            del self._until[webhook_id]
            return webhook_id
        return None


class WebhookReceiver:
    """Verifies Rhumbatron's signed webhook deliveries; thread-safe.

    ``secrets`` are the ``whsec_`` secrets this receiver holds (one, or two during a
    rotation); a malformed one is refused here, never at a request.
    """

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        clock: Clock,
        tolerance_s: int = DEFAULT_TOLERANCE_S,
        seen_capacity: int = DEFAULT_SEEN_CAPACITY,
        remember_s: int | None = None,
    ) -> None:
        if tolerance_s < 1:
            raise ConfigurationError(
                f"tolerance_s={tolerance_s} must be at least 1 s (Standard Webhooks uses "
                f"{DEFAULT_TOLERANCE_S}, RHUMBATRON_WEBHOOK_TOLERANCE_S)"
            )
        if seen_capacity < 1:
            raise ConfigurationError(
                f"seen_capacity={seen_capacity} must be at least 1 (default "
                f"{DEFAULT_SEEN_CAPACITY}): without it no replay is caught"
            )
        self._clock = clock
        self._tolerance_s = tolerance_s
        # An ID forgotten within the tolerance would let a replay through.
        self._remember_s = max(tolerance_s, remember_s or 0)
        self._lock = threading.Lock()
        self._secrets = _checked(secrets)
        self._seen = _SeenIds(seen_capacity)

    @property
    def tolerance_s(self) -> int:
        """How far a webhook's timestamp may be from now, either way."""
        return self._tolerance_s

    @property
    def seen_count(self) -> int:
        """How many accepted IDs are remembered right now."""
        with self._lock:
            self._seen.prune(self._now_s())
            return len(self._seen)

    def set_secrets(self, secrets: Sequence[str]) -> None:
        """Hold ``secrets`` from now on (a rotation: add the new one, later drop the old)."""
        checked = _checked(secrets)
        with self._lock:
            self._secrets = checked

    def verify(self, headers: Mapping[str, str], body: bytes) -> ReceivedWebhook:
        """The delivery ``headers`` and ``body`` (the exact bytes received) carry, with its
        ID remembered as accepted; raises :class:`WebhookRejected` (401) otherwise.

        Header names are case-insensitive.
        """
        now = self._clock.now()
        with self._lock:
            secrets = self._secrets
        lowered = {name.lower(): value for name, value in headers.items()}
        webhook_id = lowered.get(ID_HEADER) or None
        try:
            verify(secrets, lowered, body, now=now, tolerance_s=self._tolerance_s)
        except WebhookSignatureError as exc:
            reason = self._failed_check(lowered, now)
            raise WebhookRejected(str(exc), reason=reason, webhook_id=webhook_id) from None
        assert webhook_id is not None  # verify() refuses a request without it
        timestamp = int(lowered[TIMESTAMP_HEADER].strip())
        received = _pointer(webhook_id, timestamp, body)
        with self._lock:
            now_s = int(now.timestamp())
            self._seen.prune(now_s)
            until_s = timestamp + self._remember_s
            seen_until = self._seen.until(webhook_id)
            if seen_until is not None and seen_until != until_s:
                # The sender's retry (a new timestamp, a new signature) of a delivery this
                # receiver took: answered, not acted on twice. Remembered under the later
                # timestamp, so a replay of the retry's own bytes is caught too.
                self._seen.add(webhook_id, max(until_s, seen_until))
                return dataclasses.replace(received, duplicate=True)
            if seen_until is not None:
                raise WebhookRejected(
                    f"webhook {webhook_id!r} with timestamp {timestamp} was accepted before, "
                    f"and is still inside the {self._tolerance_s} s window: the same message "
                    "again is a replay, refused (a retry by the sender carries a new "
                    "timestamp and is answered as a duplicate)",
                    reason=RejectionReason.REPLAY,
                    webhook_id=webhook_id,
                )
            # Remembered while its timestamp passes the tolerance check; after that the
            # timestamp check refuses a replay of these bytes by itself.
            self._seen.add(webhook_id, until_s)
        return received

    def forget(self, webhook_id: str) -> None:
        """Forget that ``webhook_id`` was accepted (its processing failed): the sender's
        retry of it is then accepted instead of refused as a replay."""
        with self._lock:
            self._seen.discard(webhook_id)

    def _now_s(self) -> int:
        return int(self._clock.now().timestamp())

    def _failed_check(self, lowered: Mapping[str, str], now: datetime) -> RejectionReason:
        """Which of ``signing.verify``'s checks refused the request (its message says how)."""
        if any(not lowered.get(name) for name in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)):
            return RejectionReason.HEADERS
        raw = lowered[TIMESTAMP_HEADER].strip()
        if not (raw.isascii() and raw.isdigit()):
            return RejectionReason.HEADERS
        if abs(int(now.timestamp()) - int(raw)) > self._tolerance_s:
            return RejectionReason.TIMESTAMP
        return RejectionReason.SIGNATURE


def _checked(secrets: Sequence[str]) -> tuple[str, ...]:
    if isinstance(secrets, str) or not secrets:
        raise WebhookSecretError(
            "a webhook receiver needs a sequence of one or two whsec_ secrets (the "
            "subscription's); got "
            + ("a single string: wrap it in a list" if isinstance(secrets, str) else "none")
        )
    for secret in secrets:
        parse_secret(secret)  # a WebhookSecretError that never quotes the secret
    return tuple(secrets)


def _pointer(webhook_id: str, timestamp: int, body: bytes) -> ReceivedWebhook:
    """The pointer body's fields; a signed body of another shape is rejected (``body``)."""

    def rejected(what: str) -> WebhookRejected:
        return WebhookRejected(
            f"webhook {webhook_id!r} is signed but its body {what}; Rhumbatron's pointer body "
            f"is a JSON object of {', '.join(POINTER_FIELDS)} (subject: type and id)",
            reason=RejectionReason.BODY,
            webhook_id=webhook_id,
        )

    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise rejected(f"is not JSON ({len(body)} bytes)") from None
    if not isinstance(data, dict):
        raise rejected(f"is a JSON {type(data).__name__}, not an object")
    missing = [name for name in POINTER_FIELDS if name not in data]
    if missing:
        raise rejected(f"lacks {', '.join(missing)}")
    texts = {name: data[name] for name in ("eventId", "kind", "projectId", "link")}
    wrong = [name for name, value in texts.items() if not (isinstance(value, str) and value)]
    if wrong:
        raise rejected(f"has {', '.join(wrong)} that is not a non-empty string")
    subject = data["subject"]
    if not (
        isinstance(subject, dict)
        and isinstance(subject.get("type"), str)
        and (subject.get("id") is None or isinstance(subject.get("id"), str))
    ):
        raise rejected(f"has subject {str(subject)[:80]!r}, not {{type, id}}")
    event_id = str(texts["eventId"])
    head, sep, subscription_id = webhook_id.partition(":")
    if not sep or head != event_id or not subscription_id:
        raise rejected(
            f"names event {event_id!r} while the webhook-id is not '{event_id}:<subscriptionId>'"
        )
    return ReceivedWebhook(
        webhook_id=webhook_id,
        timestamp=timestamp,
        event_id=event_id,
        kind=str(texts["kind"]),
        subject=PointerSubject(type=subject["type"], id=subject.get("id")),
        project_id=str(texts["projectId"]),
        link=str(texts["link"]),
        subscription_id=subscription_id,
    )
