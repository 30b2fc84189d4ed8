"""The webhook URL rule: private, loopback, link-local and metadata addresses are refused
unless allow-listed (metadata never), names are refused if any address they resolve to is;
only http and https.

Name resolution goes through the standard library's ``socket.getaddrinfo``; the tests that
need a particular DNS answer replace that stdlib function, never the project's own code.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from rhumbatron.agents.url_safety import check_webhook_url
from rhumbatron.errors import ConfigurationError, UnsafeWebhookUrlError

Answer = list[tuple[Any, ...]]


def dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list[str]:
    """Make getaddrinfo answer ``answers``; return the names it was asked for."""
    asked: list[str] = []

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> Answer:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (
                socket.AF_INET6 if ":" in address else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (address, port, 0, 0) if ":" in address else (address, port),
            )
            for address in answers[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://172.16.0.9/hook", "private"),
        ("https://192.168.1.1/hook", "private"),
        ("http://[fd12:3456::1]/hook", "private"),
        ("http://169.254.10.10/hook", "link-local"),
        ("http://[fe80::1]/hook", "link-local"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("http://224.0.0.1/hook", "multicast"),
        ("http://100.64.0.1/hook", "not globally reachable"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://2130706433/hook", "loopback"),  # 127.0.0.1 as one decimal number
        ("http://0x7f.1/hook", "loopback"),
        ("http://localhost:9000/hook", "loopback"),
        ("http://api.localhost/hook", "loopback"),
    ],
)
def test_a_non_public_address_is_refused_and_named(url: str, reason: str) -> None:
    # WHEN a URL at a non-public address is checked without an allow-list
    with pytest.raises(UnsafeWebhookUrlError) as caught:
        check_webhook_url(url, ())
    # THEN the error names the URL, the reason and the setting that would allow it
    message = str(caught.value)
    assert reason in message
    assert "/hook" in message
    assert "RHUMBATRON_WEBHOOK_ALLOWED_HOSTS" in message


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://169.254.170.2/v2/credentials",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://100.100.100.200/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
    ],
)
def test_a_cloud_metadata_address_is_refused_even_when_allow_listed(url: str) -> None:
    # GIVEN the metadata host itself on the allow-list
    host = url.split("/")[2].strip("[]")
    # WHEN / THEN it is refused anyway, and the message says why
    with pytest.raises(UnsafeWebhookUrlError, match=r"metadata.*refused even when listed"):
        check_webhook_url(url, (host, "169.254.169.254", "fd00:ec2::254"))


def test_an_allow_listed_loopback_host_passes() -> None:
    url = "http://127.0.0.1:8123/hook"
    assert check_webhook_url(url, ("127.0.0.1",)) == url


def test_the_allow_list_matches_ip_literals_by_value_and_names_by_case() -> None:
    assert check_webhook_url("http://[0:0:0:0:0:0:0:1]/", ("::1",)) == "http://[0:0:0:0:0:0:0:1]/"
    assert check_webhook_url("http://LocalHost./x", ("localhost",)) == "http://LocalHost./x"


@pytest.mark.parametrize("url", ["http://8.8.8.8/hook", "https://[2606:4700:4700::1111]:8443/x"])
def test_a_public_ip_literal_passes(url: str) -> None:
    assert check_webhook_url(url, ()) == url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://8.8.8.8/hook", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("8.8.8.8/hook", "scheme"),
        ("http:///hook", "has no host"),
        ("http://8.8.8.8:99999/hook", "invalid port"),
    ],
)
def test_a_url_that_is_not_plain_http_is_refused(url: str, problem: str) -> None:
    with pytest.raises(UnsafeWebhookUrlError, match=problem):
        check_webhook_url(url, ())


def test_a_name_is_refused_if_any_address_it_resolves_to_is_private(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a name answering one public and one private address
    dns(monkeypatch, {"hooks.example.com": ["93.184.215.14", "10.0.0.7"]})
    # WHEN it is checked
    with pytest.raises(UnsafeWebhookUrlError) as caught:
        check_webhook_url("https://hooks.example.com/agent", ())
    # THEN it is refused, naming the private address it resolved to
    assert "resolves to 10.0.0.7, which is private" in str(caught.value)
    assert "'hooks.example.com'" in str(caught.value)


def test_a_name_resolving_to_a_metadata_address_is_refused_whatever_the_allow_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dns(monkeypatch, {"sneaky.example.com": ["169.254.169.254"]})
    with pytest.raises(UnsafeWebhookUrlError, match="cloud metadata address"):
        check_webhook_url("http://sneaky.example.com/", ())


def test_a_name_resolving_only_to_public_addresses_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = dns(monkeypatch, {"hooks.example.com": ["93.184.215.14", "2606:2800:21f:cb07::1"]})
    assert check_webhook_url("https://hooks.example.com/a", ()) == "https://hooks.example.com/a"
    assert asked == ["hooks.example.com"]


def test_a_name_that_does_not_resolve_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    dns(monkeypatch, {})
    with pytest.raises(UnsafeWebhookUrlError, match="cannot be resolved"):
        check_webhook_url("https://nowhere.example.com/a", ())


def test_without_resolution_a_name_is_not_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = dns(monkeypatch, {})
    assert check_webhook_url("https://hooks.example.com/a", (), resolve=False)
    assert asked == []


def test_an_allow_listed_name_is_not_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = dns(monkeypatch, {})
    assert check_webhook_url("http://agent.internal:8080/", ("agent.internal",))
    assert asked == []


def test_user_info_and_query_are_kept_out_of_the_message() -> None:
    with pytest.raises(UnsafeWebhookUrlError) as caught:
        check_webhook_url("http://user:hunter2@10.0.0.1/hook?token=abc", ())
    assert "hunter2" not in str(caught.value) and "abc" not in str(caught.value)
    assert "http://10.0.0.1/hook" in str(caught.value)


def test_unsafe_url_errors_are_configuration_errors() -> None:
    # A retry cannot make a URL safe: the registration or the setting must change.
    with pytest.raises(ConfigurationError):
        check_webhook_url("http://10.0.0.1/", ())
