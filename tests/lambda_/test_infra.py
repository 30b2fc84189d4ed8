"""infra/: the network stack, the NATS cluster stack and its nats-server configs hold together,
and feed template.yaml.

No AWS account: the stacks are read as YAML (CloudFormation's short tags kept as they are) and
``make lint`` runs cfn-lint on them. The configs are read as text, and booted for real: three
nats-server processes on loopback, started from infra/nats/*.conf with only the names, ports
and paths a deployment differs in rewritten, with TLS, routes over mutual TLS and the
functions' user and password. The application then starts against them the way a function
does (credentials from a Secrets Manager secret on moto, the durability check on /varz, R3
streams).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets as random_secrets
import ssl
import string
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rhumbatron.core.settings import load_settings
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import find_nats_server_binary, free_port

from .support import CloudFormationLoader, Tag, TlsFiles, issue_certificates

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
CONFIGS = INFRA / "nats"
NODES = (1, 2, 3)
NAMESPACE = "rhumbatron.internal"
#: What the booted cluster's certificates name, standing in for the Cloud Map names.
HOST = "localhost"

#: The container environment variables each config file travels in (nats-cluster.yaml).
CONFIG_VARIABLES = {
    "NATS_CONF_COMMON": "common.conf",
    "NATS_CONF_NODE1": "node1.conf",
    "NATS_CONF_NODE2": "node2.conf",
    "NATS_CONF_NODE3": "node3.conf",
}

#: template.yaml's parameters that the infra stacks' outputs of the same name fill.
APP_PARAMETERS_FROM_INFRA = {
    "NatsUrl": "nats-cluster.yaml",
    "NatsMonitorUrls": "nats-cluster.yaml",
    "NatsCredentialsSecretArn": "nats-cluster.yaml",
    "VpcId": "network.yaml",
    "SubnetIds": "network.yaml",
    "SecurityGroupId": "network.yaml",
    "EfsFileSystemId": "network.yaml",
    "AlarmTopicArn": "nats-cluster.yaml",
}


# -- reading the stacks ------------------------------------------------------------------------


def _stack(name: str) -> dict[str, Any]:
    loaded = yaml.load((ROOT / name).read_text(), Loader=CloudFormationLoader)
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return _stack("infra/nats-cluster.yaml")


@pytest.fixture(scope="module")
def network() -> dict[str, Any]:
    return _stack("infra/network.yaml")


def _resources(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in stack["Resources"].items() if v["Type"] == kind}


def _selected(value: Any, from_parameter: str) -> int:
    """The index of ``!Select [i, !Ref from_parameter]``."""
    assert value == Tag("Select", [value.value[0], Tag("Ref", from_parameter)]), value
    return int(value.value[0])


def _container(stack: dict[str, Any]) -> dict[str, Any]:
    (task,) = _resources(stack, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    assert isinstance(container, dict)
    return container


def _config(name: str) -> str:
    return (CONFIGS / name).read_text()


# -- the configs -------------------------------------------------------------------------------


def test_each_node_config_routes_to_the_other_two_by_cloud_map_name_over_mutual_tls() -> None:
    server_names = set()
    for n in NODES:
        # GIVEN node n's configuration
        text = _config(f"node{n}.conf")
        # THEN it includes the shared part, has its own name, and routes to the two others
        assert re.search(r"^include \./common\.conf$", text, re.M)
        server_names.add(re.findall(r"^server_name:\s*(\S+)$", text, re.M)[0])
        routes = re.findall(r"nats-route://(\S+)", text)
        assert routes == [f"nats-{m}.{NAMESPACE}:6222" for m in NODES if m != n]
        assert re.search(r"^cluster \{\n  name: rhumbatron\n  port: 6222\n", text, re.M)
        cluster_tls = text[text.index("  tls {") :]
        for line in (
            'cert_file: "/etc/nats/tls/route.pem"',
            'key_file: "/etc/nats/tls/route-key.pem"',
            'ca_file: "/etc/nats/tls/ca.pem"',
            "verify: true",
        ):
            assert line in cluster_tls, f"node{n}.conf cluster tls lacks {line}"
    assert len(server_names) == 3


def test_common_config_fsyncs_every_write_to_the_volume_and_admits_only_tls_and_passwords() -> None:
    text = _config("common.conf")
    jetstream = text[text.index("jetstream {") :]
    assert re.search(r"^  sync_interval: always$", jetstream, re.M)
    assert re.search(r'^  store_dir: "/data/jetstream"$', jetstream, re.M)
    client_tls = text[text.index("tls {") : text.index("jetstream {")]
    assert 'cert_file: "/etc/nats/tls/server.pem"' in client_tls
    assert 'key_file: "/etc/nats/tls/server-key.pem"' in client_tls
    # Every user has a password from the environment: nobody gets in anonymously.
    assert re.search(r"user: \$NATS_USER\s+password: \$NATS_PASSWORD", text)
    users = re.findall(r"\buser: (\S+?),?\s+password: (\S+?)\s", text)
    assert users == [
        ("$NATS_USER", "$NATS_PASSWORD"),
        ("$NATS_OPERATOR_USER", "$NATS_OPERATOR_PASSWORD"),
        ("$NATS_SYSTEM_USER", "$NATS_SYSTEM_PASSWORD"),
    ]
    assert "no_auth_user" not in text and "allow_non_tls" not in text
    assert "nkey" not in text, "the functions' layer has no nkeys package: users and passwords"


def test_every_node_config_passes_nats_server_config_test(tmp_path: Path) -> None:
    # GIVEN the configs with their TLS files and store in a temp dir, the passwords in the env
    tls = issue_certificates(tmp_path / "tls")
    env = {**os.environ, **_credentials_env()}
    for n in NODES:
        _render_for_loopback(tmp_path / f"node{n}", n, tls, _ports())
        # WHEN nats-server checks the node's configuration THEN it is valid
        result = subprocess.run(
            [find_nats_server_binary(), "-t", "-c", str(tmp_path / f"node{n}" / f"node{n}.conf")],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert result.returncode == 0, f"node{n}.conf: {result.stderr}{result.stdout}"


# -- the configs, booted -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Ports:
    client: int
    cluster: int
    monitor: int


def _ports() -> _Ports:
    return _Ports(free_port(), free_port(), free_port())


def _password() -> str:
    """Letters and digits, as the stack generates them (ExcludePunctuation)."""
    alphabet = string.ascii_letters + string.digits
    return "Pw" + "".join(random_secrets.choice(alphabet) for _ in range(30))


def _credentials_env(functions_password: str | None = None) -> dict[str, str]:
    return {
        "NATS_USER": "rhumbatron-functions",
        "NATS_PASSWORD": functions_password or _password(),
        "NATS_OPERATOR_USER": "rhumbatron-operator",
        "NATS_OPERATOR_PASSWORD": _password(),
        "NATS_SYSTEM_USER": "rhumbatron-system",
        "NATS_SYSTEM_PASSWORD": _password(),
    }


def _render_for_loopback(
    directory: Path,
    n: int,
    tls: TlsFiles,
    ports: _Ports,
    cluster_ports: dict[int, int] | None = None,
) -> None:
    """node{n}.conf and common.conf as a deployment runs them, but on loopback: the ports,
    the Cloud Map names, the volume and the TLS directory are the only things rewritten."""
    directory.mkdir(parents=True, exist_ok=True)
    common = _config("common.conf")
    common = _replace_line(common, "port: 4222", f"listen: 127.0.0.1:{ports.client}")
    common = _replace_line(common, "http_port: 8222", f"http: 127.0.0.1:{ports.monitor}")
    common = common.replace('"/data/jetstream"', json.dumps(str(directory / "jetstream")))
    node = _replace_line(
        _config(f"node{n}.conf"), "  port: 6222", f"  listen: 127.0.0.1:{ports.cluster}"
    )
    for m, port in (cluster_ports or {}).items():
        node = node.replace(
            f"nats-route://nats-{m}.{NAMESPACE}:6222", f"nats-route://{HOST}:{port}"
        )
    for name, text in (("common.conf", common), (f"node{n}.conf", node)):
        (directory / name).write_text(text.replace("/etc/nats/tls/", f"{tls.directory}/"))


def _replace_line(text: str, line: str, replacement: str) -> str:
    assert re.search(rf"^{re.escape(line)}$", text, re.M), f"no line {line!r}"
    return re.sub(rf"^{re.escape(line)}$", replacement, text, count=1, flags=re.M)


@dataclass
class _Node:
    n: int
    ports: _Ports
    process: subprocess.Popen[bytes]
    log: Path

    def wait_up(self, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.ports.monitor}/healthz?js-enabled-only=true"
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"node{self.n} exited: {self.log.read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"node{self.n} never came up: {self.log.read_text()}")
            time.sleep(0.02)  # polling a child process coming up, with a deadline

    def wait_meta_leader(self, deadline: float) -> None:
        """Until the node knows the cluster's JetStream meta leader: before that a JetStream
        API request waits out its whole timeout instead of failing fast."""
        url = f"http://127.0.0.1:{self.ports.monitor}/jsz"
        while True:
            with urllib.request.urlopen(url, timeout=1) as answer:
                meta = json.load(answer).get("meta_cluster") or {}
            if meta.get("leader") and meta.get("cluster_size") == len(NODES):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"node{self.n} never saw a meta leader: {meta}")
            time.sleep(0.02)  # polling the cluster electing its leader, with a deadline


@dataclass(frozen=True)
class _Cluster:
    nodes: list[_Node]
    tls: TlsFiles
    user: str
    password: str


@pytest.fixture
def booted_cluster(tmp_path: Path) -> Iterator[_Cluster]:
    """Three nats-server processes from infra/nats/*.conf, routed to each other on loopback."""
    tls = issue_certificates(tmp_path / "tls")
    env = _credentials_env()
    ports = {n: _ports() for n in NODES}
    cluster_ports = {n: p.cluster for n, p in ports.items()}
    nodes: list[_Node] = []
    try:
        for n in NODES:
            directory = tmp_path / f"node{n}"
            _render_for_loopback(directory, n, tls, ports[n], cluster_ports)
            log = directory / "nats.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [find_nats_server_binary(), "-c", str(directory / f"node{n}.conf")],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                    start_new_session=True,
                )
            nodes.append(_Node(n, ports[n], process, log))
        deadline = time.monotonic() + 15
        for node in nodes:
            node.wait_up(deadline)
        for node in nodes:
            node.wait_meta_leader(deadline)
        yield _Cluster(nodes, tls, env["NATS_USER"], env["NATS_PASSWORD"])
    finally:
        for node in nodes:
            node.process.terminate()
        for node in nodes:
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(timeout=10)


@pytest.fixture
def secrets_manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 Secrets Manager client on moto, with fake credentials."""
    from moto import mock_aws

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        import boto3

        yield boto3.client("secretsmanager", region_name="eu-west-1")


async def _streams_ready(app: Rhumbatron, *, timeout_s: float = 20) -> None:
    """Create the streams once the cluster has elected its meta leader."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await app.ensure_streams()
            return
        except Exception as exc:  # no meta leader elected yet: JetStream answers with errors
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster never accepted the streams: {exc}") from exc
            await asyncio.sleep(0.2)  # polling the cluster coming up, with a deadline


@pytest.mark.integration
def test_the_configs_boot_a_tls_cluster_the_functions_start_against_with_r3_streams(
    tmp_path: Path,
    booted_cluster: _Cluster,
    secrets_manager: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the cluster the configs describe, and the functions' secret in the stack's shape
    arn = secrets_manager.create_secret(
        Name="rhumbatron-nats/nats/functions",
        SecretString=json.dumps({"user": booted_cluster.user, "password": booted_cluster.password}),
    )["ARN"]
    # ... and the cluster's private CA in a secret too: the client trusts exactly it.
    ca_arn = secrets_manager.create_secret(
        Name="rhumbatron-nats/nats/ca", SecretString=booted_cluster.tls.ca.read_text()
    )["ARN"]
    first = booted_cluster.nodes[0].ports
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url=f"tls://{HOST}:{first.client}",
        nats_monitor_urls=",".join(
            f"http://127.0.0.1:{node.ports.monitor}" for node in booted_cluster.nodes
        ),
        nats_credentials_secret_arn=arn,
        nats_tls_ca_secret_arn=ca_arn,
        stream_replicas=3,
        require_durable_jetstream=True,
    )

    # WHEN a function starts: durability checked on /varz, streams created or reconciled
    app = bootstrap(settings)

    async def start_and_inspect() -> tuple[int, int]:
        try:
            await _streams_ready(app)
            js = (await app.nats()).jetstream()
            info = await js.stream_info(COMMAND_STREAM)
            assert info.cluster is not None
            return info.config.num_replicas or 1, len(info.cluster.replicas or []) + 1
        finally:
            await app.close()

    replicas, members = asyncio.run(start_and_inspect())

    # THEN it started (no UnsafeStorageError), and its streams live on all three nodes
    assert (replicas, members) == (3, 3)


@pytest.mark.integration
def test_the_booted_cluster_refuses_a_wrong_password(
    tmp_path: Path, booted_cluster: _Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nats
    from nats.errors import Error as NatsError

    monkeypatch.setenv("SSL_CERT_FILE", str(booted_cluster.tls.ca))
    port = booted_cluster.nodes[1].ports.client

    async def connect(password: str) -> None:
        nc = await nats.connect(
            servers=[f"tls://{HOST}:{port}"],
            user=booted_cluster.user,
            password=password,
            tls=ssl.create_default_context(cafile=str(booted_cluster.tls.ca)),
            allow_reconnect=False,
            connect_timeout=2,
            max_reconnect_attempts=0,
        )
        await nc.close()

    # WHEN a client presents the right password THEN it is in
    asyncio.run(connect(booted_cluster.password))
    # AND with a wrong one it is refused
    with pytest.raises((NatsError, OSError)):
        asyncio.run(connect(booted_cluster.password + "x"))


# -- the cluster stack -------------------------------------------------------------------------


def test_task_environment_carries_the_config_files_verbatim(cluster: dict[str, Any]) -> None:
    environment = {e["Name"]: e["Value"] for e in _container(cluster)["Environment"]}
    for variable, name in CONFIG_VARIABLES.items():
        assert environment.get(variable) == _config(name), (
            f"infra/nats-cluster.yaml {variable} differs from infra/nats/{name}: copy the file "
            "into that environment variable's block, as it is"
        )


def test_every_variable_the_configs_read_comes_from_a_secret_of_the_task(
    cluster: dict[str, Any],
) -> None:
    container = _container(cluster)
    from_secrets = {s["Name"]: s["ValueFrom"] for s in container["Secrets"]}
    read = set()
    for name in CONFIG_VARIABLES.values():
        # Variable references outside comments and quoted strings ("$JS.API.>" is a subject).
        text = re.sub(r"#.*|\"[^\"]*\"", "", _config(name))
        read |= set(re.findall(r"\$([A-Z][A-Z0-9_]*)", text))
    assert read, "the configs read no variables: where do the passwords come from?"
    assert read <= set(from_secrets), f"not provided: {read - set(from_secrets)}"
    # The functions' pair is the secret template.yaml is given (NatsCredentialsSecretArn).
    assert from_secrets["NATS_USER"] == Tag("Sub", "${FunctionsCredentials}:user::")
    assert from_secrets["NATS_PASSWORD"] == Tag("Sub", "${FunctionsCredentials}:password::")
    assert cluster["Outputs"]["NatsCredentialsSecretArn"]["Value"] == Tag(
        "Ref", "FunctionsCredentials"
    )


def test_the_stack_generates_the_functions_user_and_password_in_the_shape_they_read(
    cluster: dict[str, Any],
) -> None:
    for logical_id in ("FunctionsCredentials", "OperatorCredentials", "SystemCredentials"):
        generated = cluster["Resources"][logical_id]["Properties"]["GenerateSecretString"]
        template = json.loads(generated["SecretStringTemplate"])
        # {"user", "password"}: the shape rhumbatron.messaging.connection reads, and the JSON
        # keys the task's Secrets pick; letters and digits, which nats-server reads as text.
        assert set(template) | {generated["GenerateStringKey"]} == {"user", "password"}
        assert generated["ExcludePunctuation"] is True
        assert generated["RequireEachIncludedType"] is True
        assert generated["PasswordLength"] >= 32


def test_the_task_writes_every_tls_file_the_configs_read_from_the_tls_secret(
    cluster: dict[str, Any],
) -> None:
    container = _container(cluster)
    (script,) = container["Command"]
    from_secrets = {s["Name"]: s["ValueFrom"] for s in container["Secrets"]}
    read = set()
    for name in CONFIG_VARIABLES.values():
        read |= set(re.findall(r'"(/etc/nats/tls/[a-z-]+\.pem)"', _config(name)))
    written = dict(re.findall(r'printf \'%s\\n\' "\$(NATS_TLS_[A-Z_]+)" > (\S+)', script))
    assert set(written.values()) == read
    for variable in written:
        key = variable.removeprefix("NATS_TLS_").lower()
        assert from_secrets[variable] == Tag("Sub", f"${{NatsTlsSecretArn}}:{key}::")
    # Each node is started with its own configuration, which includes the shared one.
    assert "printf '%s' \"$NATS_CONF_COMMON\" |" in script
    assert "> /etc/nats/common.conf" in script
    assert script.rstrip().endswith("exec nats-server -c /etc/nats/node.conf")


def _run_start_script(
    cluster: dict[str, Any], root: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The container's start script under ``root`` (for /data and /etc/nats), ending in
    ``nats-server -t`` (check the configuration) instead of running the server."""
    (script,) = _container(cluster)["Command"]
    script = _under(script, root).replace(
        "exec nats-server -c", f"exec {find_nats_server_binary()} -t -c"
    )
    return subprocess.run(
        ["/bin/sh", "-c", script], capture_output=True, text=True, env=env, check=False
    )


def _under(text: str, root: Path) -> str:
    return text.replace("/etc/nats/", f"{root}/etc/nats/").replace("/data/", f"{root}/data/")


def _container_env(
    cluster: dict[str, Any], root: Path, tls: TlsFiles, tier: str = "1000"
) -> dict[str, str]:
    """What ECS gives the container for the sizing ``tier``: the configs and the tier's store
    limit (its Environment), the TLS material and the credentials (its Secrets)."""
    environment = {
        e["Name"]: _under(e["Value"], root)
        for e in _container(cluster)["Environment"]
        if isinstance(e["Value"], str)
    }
    environment["NATS_MAX_FILE_STORE"] = f"{_tier(cluster, tier)['MaxFileStoreGB']}GB"
    pem = {
        "NATS_TLS_CA": "ca.pem",
        "NATS_TLS_SERVER_CERT": "server.pem",
        "NATS_TLS_SERVER_KEY": "server-key.pem",
        "NATS_TLS_ROUTE_CERT": "route.pem",
        "NATS_TLS_ROUTE_KEY": "route-key.pem",
    }
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **environment,
        **{name: (tls.directory / file).read_text() for name, file in pem.items()},
        **_credentials_env(),
    }


def test_the_container_starts_the_node_its_volume_names_with_files_nats_server_accepts(
    tmp_path: Path, cluster: dict[str, Any]
) -> None:
    # GIVEN node 2's volume at /data (its marker), and the container's environment
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".rhumbatron-nats-node").write_text("2\n")
    env = _container_env(cluster, tmp_path, issue_certificates(tmp_path / "issued"))

    # WHEN the container's start script runs
    result = _run_start_script(cluster, tmp_path, env)

    # THEN it wrote node 2's configuration and the certificates, and nats-server accepts them
    assert result.returncode == 0, result.stderr + result.stdout
    assert "is valid" in result.stderr + result.stdout
    written = tmp_path / "etc" / "nats"
    assert (written / "node.conf").read_text() == _under(_config("node2.conf"), tmp_path)
    assert (written / "common.conf").read_text() == _under(_config("common.conf"), tmp_path)
    # AND only the owner may read the keys
    for key in ("server-key.pem", "route-key.pem"):
        assert (written / "tls" / key).stat().st_mode & 0o077 == 0


def test_the_container_refuses_to_start_on_a_disk_that_is_not_a_nodes_volume(
    tmp_path: Path, cluster: dict[str, Any]
) -> None:
    # GIVEN /data without the marker the instance writes on the node's EBS volume
    (tmp_path / "data").mkdir()
    env = _container_env(cluster, tmp_path, issue_certificates(tmp_path / "issued"))
    # WHEN the container's start script runs
    result = _run_start_script(cluster, tmp_path, env)
    # THEN it stops before anything is written, and says why
    assert result.returncode == 1
    assert "not this node's EBS volume" in result.stderr
    assert not (tmp_path / "etc").exists() and list((tmp_path / "data").iterdir()) == []


def test_three_nodes_run_in_three_subnets_and_zones_under_their_route_names(
    cluster: dict[str, Any], network: dict[str, Any]
) -> None:
    resources = cluster["Resources"]
    subnets, zones = set(), set()
    for n in NODES:
        # GIVEN node n's service, instance group and volume
        service = resources[f"Node{n}Service"]["Properties"]
        group = resources[f"Node{n}Group"]["Properties"]
        volume = resources[f"Node{n}Volume"]["Properties"]
        # THEN all three sit in subnet and zone n of the lists the network stack exports
        awsvpc = service["NetworkConfiguration"]["AwsvpcConfiguration"]
        (task_subnet,) = awsvpc["Subnets"]
        (group_subnet,) = group["VPCZoneIdentifier"]
        index = _selected(task_subnet, "NatsSubnetIds")
        assert _selected(group_subnet, "NatsSubnetIds") == index == n - 1
        assert _selected(volume["AvailabilityZone"], "NatsAvailabilityZones") == index
        subnets.add(index)
        zones.add(index)
        # AND the task runs only on the node's own instance, which attaches the node's volume
        assert service["PlacementConstraints"] == [
            {"Type": "memberOf", "Expression": f"attribute:rhumbatron_nats_node == {n}"}
        ]
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        assert tags["RhumbatronNatsNode"] == str(n)
        assert tags["RhumbatronNatsVolume"] == Tag("Ref", f"Node{n}Volume")
        # AND it is registered under the name the other nodes' routes use
        registry = service["ServiceRegistries"][0]["RegistryArn"]
        assert registry == Tag("GetAtt", f"Node{n}Name.Arn")
        assert resources[f"Node{n}Name"]["Properties"]["Name"] == f"nats-{n}"
        assert service["DesiredCount"] == 1
    assert len(subnets) == len(zones) == 3
    (namespace,) = _resources(cluster, "AWS::ServiceDiscovery::PrivateDnsNamespace").values()
    assert namespace["Properties"]["Name"] == NAMESPACE
    # AND the network stack's three NATS subnets are in three different zones, listed in order
    outputs = network["Outputs"]
    joined = outputs["NatsSubnetIds"]["Value"].value[1]
    azs = [network["Resources"][s.value]["Properties"]["AvailabilityZone"] for s in joined]
    assert [az.value[0] for az in azs] == [0, 1, 2]
    assert all(az.value[1] == Tag("GetAZs", "") for az in azs)
    assert outputs["NatsAvailabilityZones"]["Value"].value[1] == [
        Tag("GetAtt", f"{s.value}.AvailabilityZone") for s in joined
    ]


def test_each_node_keeps_its_jetstream_store_on_its_own_persistent_volume(
    cluster: dict[str, Any],
) -> None:
    resources = cluster["Resources"]
    container = _container(cluster)
    (task,) = _resources(cluster, "AWS::ECS::TaskDefinition").values()
    # The store dir of the configs is on the host path the instance mounts its volume at.
    (volume,) = task["Properties"]["Volumes"]
    (mount,) = container["MountPoints"]
    assert volume["Host"]["SourcePath"] == "/data/nats"
    assert (mount["SourceVolume"], mount["ContainerPath"]) == (volume["Name"], "/data")
    store_dir = re.findall(r'store_dir: "([^"]+)"', _config("common.conf"))[0]
    assert store_dir.startswith("/data/")
    user_data = resources["InstanceLaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"][
        "Fn::Base64"
    ].value
    assert "/data/nats xfs" in user_data and "mount /data/nats" in user_data
    # The volumes outlive instances, tasks and the stack itself.
    # The smallest tier's store limit is the one common.conf names (the container writes
    # a larger tier's over it).
    max_store_gb = int(re.findall(r"max_file_store: (\d+)GB", _config("common.conf"))[0])
    assert max_store_gb == min(t["MaxFileStoreGB"] for t in cluster["Mappings"]["Sizing"].values())
    for n in NODES:
        ebs = resources[f"Node{n}Volume"]
        assert ebs["DeletionPolicy"] == ebs["UpdateReplacePolicy"] == "Snapshot"
        assert ebs["Properties"]["Encrypted"] is True
        # One task per volume: the old one stops before the new one starts.
        deployment = resources[f"Node{n}Service"]["Properties"]["DeploymentConfiguration"]
        assert (deployment["MinimumHealthyPercent"], deployment["MaximumPercent"]) == (0, 100)
    # Without the marker the instance writes on the volume, the task does not start.
    (script,) = container["Command"]
    assert "cat /data/.rhumbatron-nats-node" in script
    assert "/data/nats/.rhumbatron-nats-node" in user_data


def _tier(cluster: dict[str, Any], tier: str) -> dict[str, int]:
    sizing: dict[str, dict[str, int]] = cluster["Mappings"]["Sizing"]
    return sizing[tier]


#: On-disk bytes per stored event (envelope, headers and the store's index), the sizing model
#: of nats-cluster.yaml's Sizing mapping.
_BYTES_PER_STORED_EVENT = 1_536
#: Peak rate over the day's average the IOPS are sized for.
_PEAK_OVER_AVERAGE = 3


def test_every_sizing_tier_holds_its_volume_of_events_and_their_fsyncs(
    cluster: dict[str, Any],
) -> None:
    settings = load_settings(state_dir=Path("/tmp/unused"), nats_url="nats://127.0.0.1:1")
    parameter = cluster["Parameters"]["ExpectedEventsPerDay"]
    tiers = cluster["Mappings"]["Sizing"]
    assert parameter["AllowedValues"] == list(tiers) and parameter["Default"] == "1000"
    # The app's default volume is the smallest tier's
    app = _stack("template.yaml")["Parameters"]["ExpectedEventsPerDay"]
    assert app["Default"] <= int(parameter["Default"])
    for name, tier in tiers.items():
        per_day = int(name)
        # Each node stores every stream (R3): the event streams' max age of events, and the
        # command stream (much smaller: a command per routed event at most, kept 14 days,
        # counted here at a tenth of the events)
        stored_gb = (
            per_day
            * _BYTES_PER_STORED_EVENT
            * (settings.event_stream_max_age_days + settings.command_stream_max_age_days / 10)
            / 1e9
        )
        assert tier["MaxFileStoreGB"] >= stored_gb, (name, stored_gb)
        # The file system needs room beyond the store limit
        assert tier["VolumeSizeGiB"] * 2**30 >= 1.1 * tier["MaxFileStoreGB"] * 1e9, name
        # Every stored message waits for an fsync (sync_interval: always), at least 2 writes
        fsyncs_at_peak = per_day / 86_400 * _PEAK_OVER_AVERAGE
        assert tier["VolumeIops"] >= max(3_000, 2 * fsyncs_at_peak), name
        assert tier["VolumeThroughputMiBps"] >= 125
    # At 10^8 a day the default store would fill in under 2 days of the stream's 7
    assert _tier(cluster, "100000000")["MaxFileStoreGB"] > _tier(cluster, "1000")["MaxFileStoreGB"]


def test_each_volume_takes_its_tiers_size_iops_and_throughput_unless_overridden(
    cluster: dict[str, Any],
) -> None:
    parameters = cluster["Parameters"]
    for n in NODES:
        properties = cluster["Resources"][f"Node{n}Volume"]["Properties"]
        for field, parameter, condition in (
            ("Size", "VolumeSizeGiB", "VolumeSizeFromSizing"),
            ("Iops", "VolumeIops", "VolumeIopsFromSizing"),
            ("Throughput", "VolumeThroughputMiBps", "VolumeThroughputFromSizing"),
        ):
            key = {"Size": "VolumeSizeGiB"}.get(field, parameter)
            assert properties[field] == Tag(
                "If",
                [
                    condition,
                    Tag("FindInMap", ["Sizing", Tag("Ref", "ExpectedEventsPerDay"), key]),
                    Tag("Ref", parameter),
                ],
            ), (n, field)
            assert cluster["Conditions"][condition] == Tag("Equals", [Tag("Ref", parameter), 0])
            assert parameters[parameter]["Default"] == 0


def test_the_container_writes_its_tiers_store_limit_and_nats_server_accepts_it(
    tmp_path: Path, cluster: dict[str, Any]
) -> None:
    # GIVEN node 1's volume and the container's environment of the 10^8-a-day tier
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".rhumbatron-nats-node").write_text("1\n")
    env = _container_env(cluster, tmp_path, issue_certificates(tmp_path / "issued"), "100000000")
    environment = {e["Name"]: e["Value"] for e in _container(cluster)["Environment"]}
    assert environment["NATS_MAX_FILE_STORE"] == Tag(
        "Sub",
        [
            "${Gb}GB",
            {
                "Gb": Tag(
                    "FindInMap", ["Sizing", Tag("Ref", "ExpectedEventsPerDay"), "MaxFileStoreGB"]
                )
            },
        ],
    )
    # WHEN the start script runs
    result = _run_start_script(cluster, tmp_path, env)
    # THEN common.conf holds that tier's limit in place of the smallest's, and nothing else
    #   changed; nats-server accepts it
    assert result.returncode == 0, result.stderr + result.stdout
    written = (tmp_path / "etc" / "nats" / "common.conf").read_text()
    expected = _under(_config("common.conf"), tmp_path).replace(
        "  max_file_store: 200GB\n", "  max_file_store: 1300GB\n"
    )
    assert written == expected
    assert "max_file_store: 1300GB" in written


def test_nodes_update_one_at_a_time(cluster: dict[str, Any]) -> None:
    resources = cluster["Resources"]
    assert "Node1Service" not in " ".join(resources["Node1Service"]["DependsOn"])
    assert "Node1Service" in resources["Node2Service"]["DependsOn"]
    assert "Node2Service" in resources["Node3Service"]["DependsOn"]


def test_monitoring_and_clients_are_reachable_from_the_functions_only(
    cluster: dict[str, Any],
) -> None:
    groups = _resources(cluster, "AWS::EC2::SecurityGroup")
    ingress = {
        name: group["Properties"].get("SecurityGroupIngress", []) for name, group in groups.items()
    }
    rules = [(name, r) for name, rs in ingress.items() for r in rs]
    rules += [
        (props["GroupId"].value, props)
        for props in (
            r["Properties"] for r in _resources(cluster, "AWS::EC2::SecurityGroupIngress").values()
        )
    ]
    # No address range anywhere: only security groups are admitted.
    assert all("CidrIp" not in r and "CidrIpv6" not in r for _, r in rules)
    sources: dict[tuple[str, int], set[str]] = {}  # (group, port) -> the groups it admits
    for group, r in rules:
        sources.setdefault((group, r["FromPort"]), set()).add(r["SourceSecurityGroupId"].value)
    assert sources[("LoadBalancerSecurityGroup", 8222)] == {"SecurityGroupId"}
    assert sources[("LoadBalancerSecurityGroup", 4222)] == {"SecurityGroupId"}
    assert sources[("NatsSecurityGroup", 8222)] == {"SecurityGroupId", "LoadBalancerSecurityGroup"}
    assert sources[("NatsSecurityGroup", 6222)] == {"NatsSecurityGroup"}
    (balancer,) = _resources(cluster, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert balancer["Properties"]["Scheme"] == "internal"


# -- the network stack -------------------------------------------------------------------------


def test_network_gives_the_functions_the_endpoints_they_call(network: dict[str, Any]) -> None:
    endpoints = _resources(network, "AWS::EC2::VPCEndpoint").values()
    unconditional = {
        e["Properties"]["ServiceName"].value.rsplit(".", 1)[-1]: e["Properties"]["VpcEndpointType"]
        for e in endpoints
        if "Condition" not in e
    }
    assert unconditional == {
        "s3": "Gateway",
        "lambda": "Interface",
        "secretsmanager": "Interface",
        "states": "Interface",
        "logs": "Interface",
        "monitoring": "Interface",
    }
    # The functions' two subnets: two zones, and an EFS mount target in each.
    joined = network["Outputs"]["SubnetIds"]["Value"].value[1]
    targets = {
        t["Properties"]["SubnetId"].value
        for t in _resources(network, "AWS::EFS::MountTarget").values()
    }
    assert {s.value for s in joined} <= targets and len(joined) == 2


# -- the stacks feed template.yaml -------------------------------------------------------------


def test_the_app_templates_network_and_nats_parameters_are_infra_outputs_of_the_same_name(
    cluster: dict[str, Any], network: dict[str, Any]
) -> None:
    app = _stack("template.yaml")
    stacks = {"nats-cluster.yaml": cluster, "network.yaml": network}
    for parameter, stack in APP_PARAMETERS_FROM_INFRA.items():
        assert parameter in app["Parameters"], f"template.yaml has no parameter {parameter}"
        assert parameter in stacks[stack]["Outputs"], f"{stack} has no output {parameter}"
    # The cluster stack's own network parameters are network outputs of the same name too.
    for parameter in ("VpcId", "NatsSubnetIds", "NatsAvailabilityZones", "SecurityGroupId"):
        assert parameter in cluster["Parameters"] and parameter in network["Outputs"]
    # AND with the default client name the URLs fit what template.yaml accepts.
    client = cluster["Parameters"]["ClientDnsName"]["Default"]
    for parameter in ("NatsUrl", "NatsMonitorUrls"):
        output = cluster["Outputs"][parameter]["Value"]
        value = getattr(output, "value", output).replace("${ClientDnsName}", client)
        assert re.fullmatch(app["Parameters"][parameter]["AllowedPattern"], value), value
    arn = (
        "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rhumbatron-nats/nats/functions-Ab1Cd2"
    )
    assert re.fullmatch(app["Parameters"]["NatsCredentialsSecretArn"]["AllowedPattern"], arn)


def test_every_output_is_exported_under_the_stack_name(
    cluster: dict[str, Any], network: dict[str, Any]
) -> None:
    for name, output in network["Outputs"].items():
        assert output["Export"]["Name"] == Tag("Sub", f"${{AWS::StackName}}-{name}")
    for name in APP_PARAMETERS_FROM_INFRA:
        if name in cluster["Outputs"]:
            export = cluster["Outputs"][name]["Export"]["Name"]
            assert export == Tag("Sub", f"${{AWS::StackName}}-{name}")
