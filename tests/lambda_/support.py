"""What the Lambda-role tests share: a context object like Lambda's, the sample events, and
loading a function's ``app.py`` the way the Lambda runtime does (by file, not by package)."""

from __future__ import annotations

import importlib.util
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "functions"
EVENTS = ROOT / "events"


@dataclass
class FakeLambdaContext:
    """The attributes of Lambda's context object that the handler and Powertools read."""

    remaining_ms: int = 60_000
    function_name: str = "RhumbatronFunction"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:eu-west-1:123456789012:function:RhumbatronFunction"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def load_app(role: str) -> ModuleType:
    """``functions/<role>/app.py`` as a fresh module (a cold container loads it once)."""
    spec = importlib.util.spec_from_file_location(f"{role}_app", FUNCTIONS / role / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sample_event(name: str) -> dict[str, Any]:
    """One of the sample events in ``events/``."""
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


# -- CloudFormation YAML -----------------------------------------------------------------------


@dataclass(frozen=True)
class Tag:
    """A CloudFormation short-form intrinsic (``!Ref X``, ``!GetAtt A.B``, ``!Sub ...``)."""

    name: str
    value: Any


class CloudFormationLoader(yaml.SafeLoader):
    """A safe YAML loader that keeps CloudFormation's ``!`` tags as :class:`Tag` values."""


def _construct_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tag:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    return Tag(suffix, value)


CloudFormationLoader.add_multi_constructor("!", _construct_tag)


@dataclass(frozen=True)
class TlsFiles:
    """Certificates written for a TLS nats-server: their directory and the CA's PEM."""

    directory: Path
    ca: Path


def issue_certificates(directory: Path, host: str = "localhost") -> TlsFiles:
    """A CA, and one certificate it signs for ``host`` (server and client use), written
    under the file names the configs read (server/route, their keys, the CA). A name, not an
    address, as in the cloud: the members the client and the routes learn from the cluster
    are addresses, verified against the name they were reached by."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True)
    now = datetime.now(UTC)

    def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rhumbatron test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(host)]),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name in ("server", "route"):
        (directory / f"{name}.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        (directory / f"{name}-key.pem").write_bytes(_pem_key(key))
    return TlsFiles(directory, ca_path)


#: Each queue's consumer function and the queues it polls (template.yaml).
QUEUE_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "AgentWakeupsFunction": ("agent-wakeups",),
    "IntegrationFunction": ("integration", "verification", "release"),
    "IndexingFunction": ("indexing",),
    "DeadLetterFunction": ("dead-letter",),
}
