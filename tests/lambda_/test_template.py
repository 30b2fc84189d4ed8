"""template.yaml, the layer recipes, the sample events and the NATS configs hold together.

No Docker, no AWS account: the template is read as YAML (CloudFormation's short tags kept as
they are), the recipes run with ``make`` into temp dirs, and the nats-server configs go
through ``nats-server -t``.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rhumbatron.entrypoints.outbox_publisher import ScheduledJob, parse_invocation
from rhumbatron.local.nats_server import find_nats_server_binary
from rhumbatron.runtime.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
EVENTS = ROOT / "events"
LAYERS = ROOT / "layers"
NATS_CONFIGS = ROOT / "infra" / "nats"

#: Environment the template sets that the package does not read yet (and why): none.
NOT_YET_SETTINGS: set[str] = set()


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


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(TEMPLATE.read_text(), Loader=CloudFormationLoader)
    return loaded


def _resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return _resources(template, "AWS::Serverless::Function")


def _function_property(template: dict[str, Any], function: dict[str, Any], name: str) -> Any:
    """A function's property, falling back to Globals like SAM does."""
    if name in function["Properties"]:
        return function["Properties"][name]
    return template["Globals"]["Function"].get(name)


def _environment(template: dict[str, Any], function: dict[str, Any]) -> dict[str, Any]:
    merged = dict(template["Globals"]["Function"]["Environment"]["Variables"])
    merged.update(function["Properties"].get("Environment", {}).get("Variables", {}))
    return merged


def _make_dry_run(makefile: Path, target: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-n", "-f", str(makefile), target, "ARTIFACTS_DIR=/nonexistent/artifacts"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def _makefile_of(resource: dict[str, Any], source_dir: Path) -> Path:
    """Where SAM looks for the Makefile: ContextPath if given, else the source folder."""
    context = resource.get("Metadata", {}).get("ContextPath")
    return (ROOT / context if context else source_dir) / "Makefile"


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


# -- functions -------------------------------------------------------------------------------


def test_only_the_outbox_publisher_exists_yet(template: dict[str, Any]) -> None:
    assert set(_functions(template)) == {"OutboxPublisherFunction"}
    assert "Only one function exists so far" in TEMPLATE.read_text()


def test_every_function_code_uri_holds_app_py_with_its_handler(template: dict[str, Any]) -> None:
    for name, function in _functions(template).items():
        code_dir = ROOT / function["Properties"]["CodeUri"]
        module_name, handler_name = function["Properties"]["Handler"].rsplit(".", 1)
        source = code_dir / f"{module_name}.py"
        assert source.is_file(), f"{name}: {source} is missing"
        tree = ast.parse(source.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert handler_name in defined, f"{name}: {source} defines no {handler_name}()"
        # Handlers only wire (STYLE 1): a few lines, one call into the package.
        assert len(source.read_text().splitlines()) <= 25, f"{source} is more than wiring"


def test_functions_run_python313_on_arm64_with_both_layers(template: dict[str, Any]) -> None:
    for name, function in _functions(template).items():
        assert _function_property(template, function, "Runtime") == "python3.13", name
        assert _function_property(template, function, "Architectures") == ["arm64"], name
        layers = _function_property(template, function, "Layers")
        assert Tag("Ref", "DependenciesLayer") in layers, name
        assert Tag("Ref", "CodeLayer") in layers, name


@needs_make
def test_every_function_build_target_exists(template: dict[str, Any]) -> None:
    for name, function in _functions(template).items():
        metadata = function.get("Metadata", {})
        if metadata.get("BuildMethod") != "makefile":
            continue
        code_dir = ROOT / function["Properties"]["CodeUri"]
        result = _make_dry_run(_makefile_of(function, code_dir), f"build-{name}", code_dir)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_schedule_sends_the_sample_schedule_event(template: dict[str, Any]) -> None:
    function = _functions(template)["OutboxPublisherFunction"]
    schedules = [
        event["Properties"]
        for event in function["Properties"]["Events"].values()
        if event["Type"] == "ScheduleV2"
    ]
    assert len(schedules) == 1
    assert schedules[0]["ScheduleExpression"] == "rate(1 minute)"
    sample = json.loads((EVENTS / "outbox_publisher_schedule.json").read_text())
    assert json.loads(schedules[0]["Input"]) == sample
    assert isinstance(parse_invocation(sample), ScheduledJob)


# -- layers ----------------------------------------------------------------------------------


@needs_make
def test_every_layer_has_its_content_and_a_makefile_target(template: dict[str, Any]) -> None:
    layers = _resources(template, "AWS::Serverless::LayerVersion")
    assert set(layers) == {"DependenciesLayer", "CodeLayer"}
    for name, layer in layers.items():
        content = ROOT / layer["Properties"]["ContentUri"]
        assert content.is_dir(), f"{name}: ContentUri {content} is missing"
        assert layer["Metadata"]["BuildMethod"] == "makefile", name
        assert layer["Properties"]["CompatibleRuntimes"] == ["python3.13"], name
        makefile = _makefile_of(layer, content)
        assert makefile.is_file(), f"{name}: {makefile} is missing"
        result = _make_dry_run(makefile, f"build-{name}", content)
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert '$(ARTIFACTS_DIR)/python"' in makefile.read_text()


def test_dependency_layer_is_for_the_lambda_platform_and_leaves_boto_out() -> None:
    recipe = (LAYERS / "Makefile").read_text()
    for flag in (
        "--platform manylinux2014_aarch64",
        "--python-version 3.13",
        "--only-binary=:all:",
        "--implementation cp",
    ):
        assert flag in recipe
    wanted = _requirement_names(LAYERS / "requirements.txt") | _requirement_names(
        LAYERS / "requirements-no-deps.txt"
    )
    assert not wanted & {"boto3", "botocore", "s3transfer"}
    # Powertools' Tracer needs the X-Ray SDK (its `tracer` extra), installed without botocore.
    assert "aws-xray-sdk" in wanted
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]} - {"boto3"}
    assert runtime <= wanted, f"the layer misses {runtime - wanted}"


def _requirement_name(line: str) -> str:
    return re.split(r"[\s\[<>=!~;]", line.strip(), maxsplit=1)[0].lower()


def _requirement_names(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {_requirement_name(line) for line in lines if line}


@needs_make
def test_code_layer_holds_what_the_handler_imports_and_not_the_local_stack(
    tmp_path: Path,
) -> None:
    # GIVEN the code layer and the function built as `sam build` builds them
    layer, function = tmp_path / "CodeLayer", tmp_path / "OutboxPublisherFunction"
    makefile = str(LAYERS / "Makefile")
    for target, artifacts, cwd in (
        ("build-CodeLayer", layer, ROOT / "shared"),
        ("build-OutboxPublisherFunction", function, ROOT / "functions" / "outbox_publisher"),
    ):
        artifacts.mkdir()
        subprocess.run(
            ["make", "-s", "-f", makefile, target, f"ARTIFACTS_DIR={artifacts}", "PYTHON313="],
            cwd=cwd,
            check=True,
        )
    assert not (layer / "python" / "rhumbatron" / "local").exists()

    # WHEN a fresh interpreter imports the handler, then every module, from the build alone
    probe = f"""
import importlib, pkgutil, sys
sys.path[:0] = [{str(function)!r}, {str(layer / "python")!r}]
import app
import rhumbatron
assert rhumbatron.__file__.startswith({str(layer)!r}), rhumbatron.__file__
loaded = sorted(m for m in sys.modules if m.startswith("rhumbatron.local"))
assert not loaded, loaded
for module in pkgutil.walk_packages(rhumbatron.__path__, "rhumbatron."):
    importlib.import_module(module.name)
try:
    import rhumbatron.local
except ModuleNotFoundError:
    print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )

    # THEN everything imports, and the local stack is not in the layer
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# -- events ----------------------------------------------------------------------------------


def test_every_sample_event_is_json_the_handler_accepts() -> None:
    samples = sorted(EVENTS.glob("*.json"))
    assert {p.name for p in samples} >= {
        "outbox_publisher_schedule.json",
        "outbox_publisher_alarm.json",
    }
    for path in samples:
        event = json.loads(path.read_text())
        if path.name.startswith("outbox_publisher_"):
            parse_invocation(event)


# -- storage and settings --------------------------------------------------------------------


def test_evidence_bucket_expires_events_after_365_days_and_stays_private(
    template: dict[str, Any],
) -> None:
    (bucket,) = _resources(template, "AWS::S3::Bucket").values()
    properties = bucket["Properties"]
    rules = properties["LifecycleConfiguration"]["Rules"]
    expiring = [r for r in rules if r.get("Prefix") == "events/" and r["Status"] == "Enabled"]
    assert [r["ExpirationInDays"] for r in expiring] == [365]
    assert properties.get("VersioningConfiguration", {}).get("Status") != "Enabled"
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    block = properties["PublicAccessBlockConfiguration"]
    assert all(block[k] is True for k in ("BlockPublicAcls", "BlockPublicPolicy"))
    assert all(block[k] is True for k in ("IgnorePublicAcls", "RestrictPublicBuckets"))


def test_functions_keep_sqlite_on_efs_with_the_rollback_journal(template: dict[str, Any]) -> None:
    for name, function in _functions(template).items():
        env = _environment(template, function)
        assert env["RHUMBATRON_STATE_DIR"] == "/mnt/state", name
        assert env["RHUMBATRON_JOURNAL_MODE"] == "DELETE", name
        assert env["RHUMBATRON_NETWORK_FILESYSTEM"] == "true", name
        mounts = _function_property(template, function, "FileSystemConfigs")
        assert [m["LocalMountPath"] for m in mounts] == ["/mnt/state"], name
        assert mounts[0]["Arn"] == Tag("GetAtt", "StateAccessPoint.Arn"), name
    access_point = template["Resources"]["StateAccessPoint"]
    assert access_point["Type"] == "AWS::EFS::AccessPoint"


def test_template_environment_names_only_real_settings_and_they_load(
    template: dict[str, Any], tmp_path: Path
) -> None:
    # pydantic-settings ignores an unknown RHUMBATRON_* variable: a typo would go unnoticed.
    for name, function in _functions(template).items():
        env = _environment(template, function)
        ours = {k: v for k, v in env.items() if k.startswith("RHUMBATRON_")}
        unknown = {
            k
            for k in ours
            if k.removeprefix("RHUMBATRON_").lower() not in Settings.model_fields
            and k not in NOT_YET_SETTINGS
        }
        assert not unknown, f"{name} sets variables no setting reads: {sorted(unknown)}"
        plain = {
            k.removeprefix("RHUMBATRON_").lower(): v
            for k, v in ours.items()
            if isinstance(v, str) and k not in NOT_YET_SETTINGS
        }
        plain["state_dir"] = str(tmp_path / "state")  # /mnt/state is the EFS mount
        settings = load_settings(**plain)
        assert settings.journal_mode == "DELETE"
        assert settings.stream_replicas == 3
        assert settings.require_durable_jetstream is True


# -- NATS cluster configs --------------------------------------------------------------------


def _public_user_nkey(seed: bytes) -> str:
    """A user nkey (``U...``): prefix byte, 32 key bytes, CRC-16/XMODEM, base32 unpadded."""
    raw = bytes([20 << 3]) + seed
    crc = 0
    for byte in raw:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return base64.b32encode(raw + crc.to_bytes(2, "little")).decode().rstrip("=")


def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nats.rhumbatron.test")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_nats_cluster_configs_are_three_durable_nodes_routed_to_each_other() -> None:
    common = (NATS_CONFIGS / "common.conf").read_text()
    assert re.search(r"^\s*sync_interval:\s*always\s*$", common, re.M)
    assert re.search(r'^\s*store_dir:\s*"/data/jetstream"', common, re.M)
    names = set()
    for n in (1, 2, 3):
        text = (NATS_CONFIGS / f"node{n}.conf").read_text()
        assert "include ./common.conf" in text
        server_name = re.search(r"^server_name:\s*(\S+)", text, re.M)
        assert server_name, f"node{n}.conf has no server_name"
        names.add(server_name.group(1))
        routes = set(re.findall(r"nats-route://nats-(\d)\.", text))
        assert routes == {str(m) for m in (1, 2, 3) if m != n}, f"node{n} routes {routes}"
    assert len(names) == 3


def test_nats_cluster_configs_pass_nats_server_config_test(tmp_path: Path) -> None:
    # GIVEN the configs with their TLS paths and store pointed into a temp dir
    cert, key = _self_signed_certificate(tmp_path)
    for source in NATS_CONFIGS.glob("*.conf"):
        text = re.sub(r"/etc/nats/tls/[a-z]+-key\.pem", str(key), source.read_text())
        text = re.sub(r"/etc/nats/tls/[a-z]+\.pem", str(cert), text)
        text = text.replace("/data/jetstream", str(tmp_path / "jetstream"))
        (tmp_path / source.name).write_text(text)
    env = {
        **os.environ,
        **{
            f"RHUMBATRON_{who}_NKEY": _public_user_nkey(os.urandom(32))
            for who in ("FUNCTIONS", "OPERATOR", "SYSTEM")
        },
    }

    # WHEN nats-server checks each node's configuration THEN each is valid
    for n in (1, 2, 3):
        result = subprocess.run(
            [find_nats_server_binary(), "-t", "-c", str(tmp_path / f"node{n}.conf")],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert result.returncode == 0, f"node{n}.conf: {result.stderr}{result.stdout}"
