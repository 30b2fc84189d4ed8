"""Which webhook URLs Rhumbatron may call: no private networks, no cloud metadata (SSRF).

An agent's URL is chosen by whoever registers the agent, and Rhumbatron calls it from inside
the deployment's network. Left unchecked, a URL such as ``http://169.254.169.254/latest/...``
would make Rhumbatron fetch its own cloud credentials, and ``http://10.0.0.5/admin`` would
reach services never meant to be public. So a URL is refused at registration and again at
every send when its host is, or resolves to, a private, loopback, link-local, reserved,
multicast or unspecified address — unless the host is in ``webhook_allowed_hosts``
(``RHUMBATRON_WEBHOOK_ALLOWED_HOSTS``; tests and the demo allow ``127.0.0.1``). Cloud
metadata addresses are refused even when allow-listed: no agent has a reason to call them.

The check at send catches a name whose DNS answer changed since registration. A name that
changes its answer between this check and the connection (DNS rebinding) is not caught here;
that needs the connection pinned to the checked address, which a later change can add.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address
from urllib.parse import SplitResult, urlsplit, urlunsplit

from rhumbatron.errors import UnsafeWebhookUrlError

__all__ = [
    "ALLOWED_HOSTS_SETTING",
    "METADATA_ADDRESSES",
    "METADATA_HOSTS",
    "check_webhook_url",
    "display_url",
]

ALLOWED_HOSTS_SETTING = "RHUMBATRON_WEBHOOK_ALLOWED_HOSTS"
_SCHEMES = frozenset({"http", "https"})

#: Instance and task metadata services: they hand out the machine's cloud credentials.
METADATA_ADDRESSES: frozenset[IPv4Address | IPv6Address] = frozenset(
    ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure and OCI instance metadata
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "169.254.170.23",  # AWS EKS Pod Identity
        "fd00:ec2::254",  # AWS instance metadata over IPv6
        "fd00:ec2::23",  # AWS EKS Pod Identity over IPv6
        "100.100.100.200",  # Alibaba Cloud instance metadata
    )
)
#: Names of metadata services, refused without asking DNS.
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog"})
#: The legacy numeric IPv4 forms (2130706433, 0x7f.1, 0177.0.0.1) that resolvers accept.
_NUMERIC_HOST = re.compile(r"^[0-9a-fx.]+$")

_Address = IPv4Address | IPv6Address


def check_webhook_url(url: str, allowed_hosts: Sequence[str], *, resolve: bool = True) -> str:
    """Return ``url`` if Rhumbatron may POST to it; raise :class:`UnsafeWebhookUrlError`.

    Only ``http`` and ``https``. An IP-literal host is checked as it is; a name is resolved
    (when ``resolve``) and refused if ANY of its addresses is unsafe, since the connection
    may use any of them. ``localhost`` and ``*.localhost`` are loopback without asking DNS.
    A host in ``allowed_hosts`` passes unresolved, unless it is a metadata address.
    """
    parts = urlsplit(url.strip())
    shown = _shown(parts)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise UnsafeWebhookUrlError(
            f"webhook URL {shown!r} has scheme {scheme or '(none)'!r}; only http and https "
            "are allowed"
        )
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UnsafeWebhookUrlError(f"webhook URL {shown!r} has no host")
    try:
        port = parts.port
    except ValueError:
        raise UnsafeWebhookUrlError(f"webhook URL {shown!r} has an invalid port") from None

    literal = _ip_literal(host)
    if literal is not None and _metadata(literal):
        raise _refused(shown, host, literal, "a cloud metadata address", allowable=False)
    if host in METADATA_HOSTS:
        raise _refused(shown, host, host, "a cloud metadata service", allowable=False)
    if _normalise(host) in {_normalise(allowed) for allowed in allowed_hosts}:
        return url
    if literal is not None:
        reason = _unsafe_reason(literal)
        if reason is not None:
            raise _refused(shown, host, literal, reason, allowable=True)
        return url
    if host == "localhost" or host.endswith(".localhost"):
        raise _refused(shown, host, host, "loopback", allowable=True)
    if resolve:
        for address in _resolve(shown, host, port or (443 if scheme == "https" else 80)):
            reason = _unsafe_reason(address)
            if reason is not None:
                raise _refused(shown, host, address, reason, allowable=not _metadata(address))
    return url


def display_url(url: str) -> str:
    """``url`` for messages and dead letters: without user info, query or fragment, which
    may hold credentials."""
    return _shown(urlsplit(url.strip()))


def _shown(parts: SplitResult) -> str:
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _ip_literal(host: str) -> _Address | None:
    try:
        return ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_HOST.match(host):
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _normalise(host: str) -> str:
    host = host.strip().strip("[]").rstrip(".").lower()
    literal = _ip_literal(host)
    return str(literal) if literal is not None else host


def _embedded(address: _Address) -> list[_Address]:
    """The address and any IPv4 address it carries (``::ffff:127.0.0.1``, 6to4)."""
    found: list[_Address] = []
    if isinstance(address, IPv6Address):
        # The carried IPv4 address first: it is where the connection really goes.
        found += [inner for inner in (address.ipv4_mapped, address.sixtofour) if inner]
    return [*found, address]


def _metadata(address: _Address) -> bool:
    return any(inner in METADATA_ADDRESSES for inner in _embedded(address))


def _unsafe_reason(address: _Address) -> str | None:
    """Why Rhumbatron must not call ``address``, or None for a public address."""
    if _metadata(address):
        return "a cloud metadata address"
    for inner in _embedded(address):
        for reason, unsafe in (
            ("loopback", inner.is_loopback),
            ("unspecified", inner.is_unspecified),
            ("link-local", inner.is_link_local),
            ("multicast", inner.is_multicast),
            ("private", inner.is_private),
            ("reserved", inner.is_reserved),
            ("site-local", isinstance(inner, IPv6Address) and inner.is_site_local),
            # Shared (carrier-grade NAT) space and the like: neither private nor public.
            ("not globally reachable", not inner.is_global),
        ):
            if unsafe:
                return reason
    return None


def _resolve(shown: str, host: str, port: int) -> Iterable[_Address]:
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        # Refusing is the safe side: a name that cannot be checked cannot be trusted either.
        raise UnsafeWebhookUrlError(
            f"webhook URL {shown!r}: host {host!r} cannot be resolved ({exc}); check the "
            "name, or retry when DNS answers"
        ) from None
    for _family, _type, _proto, _canonical, sockaddr in answers:
        # An IPv6 link-local answer carries its zone ("fe80::1%eth0").
        yield ip_address(str(sockaddr[0]).partition("%")[0])


def _refused(
    shown: str, host: str, address: object, reason: str, *, allowable: bool
) -> UnsafeWebhookUrlError:
    where = (
        f"is {reason}"
        if str(address) == _normalise(host)
        else f"resolves to {address}, which is {reason}"
    )
    if allowable:
        remedy = (
            f"to call it on purpose (tests, a local demo), add {host!r} to {ALLOWED_HOSTS_SETTING}"
        )
    else:
        remedy = f"metadata addresses are refused even when listed in {ALLOWED_HOSTS_SETTING}"
    return UnsafeWebhookUrlError(
        f"webhook URL {shown!r}: host {host!r} {where}; refused so that an agent's URL cannot "
        f"reach internal services; {remedy}"
    )
