"""template.yaml and infra/nats-cluster.yaml are hardened the way issue #20 asked, and every
alarm has its runbook.

Read as YAML (CloudFormation's short tags kept as :class:`Tag`), as test_template.py reads
them: every alarm notifies the stack's alarm topic and has an entry in docs/operations.md
("Dashboards and alarms"); every async-invoked function keeps what Lambda gives up on; every
schedule keeps what it could not deliver; the state machines log and time out; the sweep runs
one tick at a time unless the account cannot reserve concurrency; every function logs JSON
and is deployed through its alias `live`, which everything that invokes it invokes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .support import QUEUE_FUNCTIONS, CloudFormationLoader, Tag

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
#: The stacks with alarms, by path.
STACKS = ("template.yaml", "infra/nats-cluster.yaml")
#: The functions invoked synchronously only: the HTTP API and the state machines wait for them.
SYNC_ONLY = {"ApiFunction", "WorkflowStepFunction"}
NO_VALUE = Tag("Ref", "AWS::NoValue")
TOPIC = [Tag("If", ["CreateAlarmTopic", Tag("Ref", "AlarmTopic"), Tag("Ref", "AlarmTopicArn")])]
RUNBOOK_PARTS = ("What it means", "What to look at", "What to do")


def _load(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((ROOT / path).read_text(), Loader=CloudFormationLoader)
    return loaded


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return _load("template.yaml")


@pytest.fixture(scope="module")
def stacks() -> dict[str, dict[str, Any]]:
    return {path: _load(path) for path in STACKS}


def _resources(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in stack["Resources"].items() if r["Type"] == kind}


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return _resources(template, "AWS::Serverless::Function")


def _alarms(stack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: r["Properties"] for name, r in _resources(stack, "AWS::CloudWatch::Alarm").items()
    }


def _function_property(template: dict[str, Any], function: dict[str, Any], name: str) -> Any:
    """A function's property, falling back to Globals like SAM does."""
    if name in function["Properties"]:
        return function["Properties"][name]
    return template["Globals"]["Function"].get(name)


def _schedules(function: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        event["Properties"]
        for event in function["Properties"].get("Events", {}).values()
        if event["Type"] == "ScheduleV2"
    ]


def _refs(node: Any) -> list[str]:
    """Every name a ``!Ref`` in ``node`` names, however deep."""
    if isinstance(node, Tag):
        return [node.value] if node.name == "Ref" else _refs(node.value)
    if isinstance(node, dict):
        return [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def _watched(alarm: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(namespace, metric, dimensions) of every metric an alarm reads."""
    if "MetricName" in alarm:
        metrics = [alarm]
    else:
        metrics = [q["MetricStat"]["Metric"] for q in alarm["Metrics"] if "MetricStat" in q]
    return [
        (m["Namespace"], m["MetricName"], {d["Name"]: d["Value"] for d in m["Dimensions"]})
        for m in metrics
    ]


def _alarm_on(stack: dict[str, Any], namespace: str, metric: str, **dimensions: Any) -> list[str]:
    """The alarms that read ``metric`` with (at least) these dimension values."""
    return [
        name
        for name, alarm in _alarms(stack).items()
        for ns, watched, dims in _watched(alarm)
        if (ns, watched) == (namespace, metric)
        and all(dims.get(k) == v for k, v in dimensions.items())
    ]


def _async_invoked(template: dict[str, Any]) -> set[str]:
    """The functions something invokes asynchronously: a schedule (EventBridge Scheduler
    invokes with InvocationType Event), another function (its name or alias in that
    function's environment: the publisher's nudge), or an operator (an output that says so)."""
    functions = _functions(template)
    invoked = {name for name, function in functions.items() if _schedules(function)}
    for function in functions.values():
        variables = function["Properties"].get("Environment", {}).get("Variables", {})
        invoked |= {ref.split(".")[0] for ref in _refs(variables)} & set(functions)
    for output in template["Outputs"].values():
        if "asynchronously" in output.get("Description", ""):
            invoked |= {ref.split(".")[0] for ref in _refs(output["Value"])} & set(functions)
    return invoked


def _runbooks() -> dict[str, str]:
    """The entries of "Dashboards and alarms" in docs/operations.md: heading -> entry."""
    text = OPERATIONS.read_text()
    start = text.index("\n## Dashboards and alarms\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return {block.split("\n", 1)[0]: block for block in re.split(r"\n### ", section)[1:]}


def _alarms_named(heading: str) -> set[str]:
    return set(re.findall(r"`(\w+Alarm)`", heading))


# -- alarms: a topic and a runbook each -------------------------------------------------------


@pytest.mark.parametrize("path", STACKS)
def test_every_alarm_notifies_the_stacks_alarm_topic_on_alarm_and_on_recovery(
    stacks: dict[str, dict[str, Any]], path: str
) -> None:
    stack = stacks[path]
    # GIVEN the stack's topic: created unless AlarmTopicArn names one
    assert stack["Parameters"]["AlarmTopicArn"]["Default"] == ""
    assert stack["Conditions"]["CreateAlarmTopic"] == Tag(
        "Equals", [Tag("Ref", "AlarmTopicArn"), ""]
    )
    topic = stack["Resources"]["AlarmTopic"]
    assert (topic["Type"], topic["Condition"]) == ("AWS::SNS::Topic", "CreateAlarmTopic")
    # ... and the email AlarmEmail names subscribed to it, when one does
    (subscription,) = _resources(stack, "AWS::SNS::Subscription").values()
    assert subscription["Condition"] == "HasAlarmEmail"
    assert subscription["Properties"]["TopicArn"] == TOPIC[0]
    assert subscription["Properties"]["Endpoint"] == Tag("Ref", "AlarmEmail")
    # THEN every alarm notifies it when it fires and when it recovers
    alarms = _alarms(stack)
    assert alarms
    for name, alarm in alarms.items():
        assert alarm.get("AlarmActions") == TOPIC, name
        assert alarm.get("OKActions") == TOPIC, name


def test_every_alarm_has_one_runbook_that_says_what_it_means_and_what_to_do(
    stacks: dict[str, dict[str, Any]],
) -> None:
    # GIVEN the runbooks of docs/operations.md and the alarms of both stacks
    runbooks = _runbooks()
    alarms = {name for stack in stacks.values() for name in _alarms(stack)}
    for name in alarms:
        # THEN each alarm is named (`LogicalId`) in the heading of exactly one entry
        entries = [entry for heading, entry in runbooks.items() if name in _alarms_named(heading)]
        assert len(entries) == 1, f"{name}: {len(entries)} runbook entries name it"
        # ... which says what it means, what to look at first and what to do
        for part in RUNBOOK_PARTS:
            assert f"**{part}.**" in entries[0], (name, part)
    # AND no entry names an alarm that no stack has (a runbook left behind)
    named = {name for heading in runbooks for name in _alarms_named(heading)}
    assert named <= alarms, sorted(named - alarms)


def test_every_alarm_description_points_at_its_runbook(stacks: dict[str, dict[str, Any]]) -> None:
    for stack in stacks.values():
        for name, alarm in _alarms(stack).items():
            assert f"docs/operations.md, Dashboards and alarms, {name}." in " ".join(
                alarm["AlarmDescription"].split()
            ), name


# -- what the alarms watch ---------------------------------------------------------------------


def test_every_function_has_an_errors_alarm_on_its_live_version_that_rolls_its_deployment_back(
    template: dict[str, Any],
) -> None:
    for name, function in _functions(template).items():
        (alarm,) = _alarm_on(template, "AWS/Lambda", "Errors", FunctionName=Tag("Ref", name))
        dimensions = _watched(_alarms(template)[alarm])[0][2]
        # the version `live` points at: a fix can deploy while the old version still fails
        assert dimensions["Resource"] == Tag("Sub", f"${{{name}}}:live"), name
        assert dimensions["ExecutedVersion"] == Tag("GetAtt", f"{name}.Version.Version"), name
        preference = function["Properties"]["DeploymentPreference"]
        assert preference == {"Alarms": [Tag("Ref", alarm)]}, name


def test_functions_throttled_other_than_by_design_and_async_ones_have_their_alarms(
    template: dict[str, Any],
) -> None:
    for name, function in _functions(template).items():
        reserved = function["Properties"].get("ReservedConcurrentExecutions")
        one_at_a_time = isinstance(reserved, Tag) and reserved.value[1] == 1
        throttles = _alarm_on(template, "AWS/Lambda", "Throttles", FunctionName=Tag("Ref", name))
        # reserving 1 throttles every tick that finds the last run going: that is the design
        assert len(throttles) == (0 if one_at_a_time else 1), name
        dropped = _alarm_on(
            template, "AWS/Lambda", "AsyncEventsDropped", FunctionName=Tag("Ref", name)
        )
        assert len(dropped) == (1 if name in _async_invoked(template) else 0), name


def test_workflows_api_and_file_system_have_their_alarms(template: dict[str, Any]) -> None:
    for machine in _resources(template, "AWS::Serverless::StateMachine"):
        for metric in ("ExecutionsFailed", "ExecutionsTimedOut"):
            arn = Tag("Ref", machine)
            assert len(_alarm_on(template, "AWS/States", metric, StateMachineArn=arn)) == 1
    api = Tag("Ref", "OperatorHttpApi")
    for metric in ("5xx", "Latency"):
        assert len(_alarm_on(template, "AWS/ApiGateway", metric, ApiId=api)) == 1, metric
    # elastic throughput: no burst credits; General Purpose mode's I/O limit is what binds
    state = template["Resources"]["StateFileSystem"]["Properties"]
    assert (state["ThroughputMode"], state["PerformanceMode"]) == ("elastic", "generalPurpose")
    file_system = Tag(
        "If", ["CreateFileSystem", Tag("Ref", "StateFileSystem"), Tag("Ref", "EfsFileSystemId")]
    )
    assert len(_alarm_on(template, "AWS/EFS", "PercentIOLimit", FileSystemId=file_system)) == 1
    assert not _alarm_on(template, "AWS/EFS", "BurstCreditBalance")


def test_every_nats_node_has_its_instance_and_volume_alarms_and_the_cluster_its_quorum(
    stacks: dict[str, dict[str, Any]],
) -> None:
    cluster = stacks["infra/nats-cluster.yaml"]
    for n in (1, 2, 3):
        group = Tag("Ref", f"Node{n}Group")
        volume = Tag("Ref", f"Node{n}Volume")
        assert _alarm_on(cluster, "AWS/EC2", "StatusCheckFailed", AutoScalingGroupName=group)
        assert _alarm_on(cluster, "AWS/EC2", "CPUUtilization", AutoScalingGroupName=group)
        reads = _alarm_on(cluster, "AWS/EBS", "VolumeReadOps", VolumeId=volume)
        writes = _alarm_on(cluster, "AWS/EBS", "VolumeWriteOps", VolumeId=volume)
        assert reads == writes and len(reads) == 1, n
    (healthy,) = _alarm_on(cluster, "AWS/NetworkELB", "HealthyHostCount")
    alarm = _alarms(cluster)[healthy]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 3)


# -- what failed to run is kept --------------------------------------------------------------


def test_every_async_invoked_function_sends_what_lambda_gives_up_on_to_the_failures_queue(
    template: dict[str, Any],
) -> None:
    invoked = _async_invoked(template)
    # GIVEN the functions invoked asynchronously: all but the synchronous ones
    assert invoked == set(_functions(template)) - SYNC_ONLY
    for name in invoked:
        config = _functions(template)[name]["Properties"].get("EventInvokeConfig")
        assert config is not None, f"{name} is invoked asynchronously but has no EventInvokeConfig"
        # THEN a failure (retries spent, or too old) is recorded in a queue; SAM grants the
        # function sqs:SendMessage on it because the destination's Type is SQS. A queue
        # function's dropped ticks (about one a minute while it is busy, by design) go to a
        # queue of their own, so the failures queue holds only what means something
        kept_in = "QueueTickDropsQueue" if name in QUEUE_FUNCTIONS else "AsyncInvokeFailuresQueue"
        assert config.get("DestinationConfig", {}).get("OnFailure") == {
            "Type": "SQS",
            "Destination": Tag("GetAtt", f"{kept_in}.Arn"),
        }, name
        # ... after at most one retry, within 5 minutes: a schedule or the sweep redoes it
        assert config["MaximumRetryAttempts"] <= 1, name
        assert 60 <= config["MaximumEventAgeInSeconds"] <= 300, name
    for name in ("AsyncInvokeFailuresQueue", "QueueTickDropsQueue"):
        queue = template["Resources"][name]
        assert queue["Type"] == "AWS::SQS::Queue"
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    # ... each kept 14 days (a queue function's real failures go with its drops), and named
    # by an output, as the runbooks read them
    for name in ("AsyncInvokeFailuresQueue", "QueueTickDropsQueue"):
        assert template["Resources"][name]["Properties"]["MessageRetentionPeriod"] == 1_209_600
        assert template["Outputs"][f"{name}Url"]["Value"] == Tag("Ref", name)


def test_every_schedule_sends_what_it_could_not_deliver_to_its_dead_letter_queue(
    template: dict[str, Any],
) -> None:
    schedules = [s for f in _functions(template).values() for s in _schedules(f)]
    assert schedules
    for schedule in schedules:
        assert schedule.get("DeadLetterConfig") == {
            "Arn": Tag("GetAtt", "ScheduleDeadLetterQueue.Arn")
        }, schedule["Description"]
    queue_name = Tag("GetAtt", "ScheduleDeadLetterQueue.QueueName")
    assert _alarm_on(
        template, "AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName=queue_name
    )


# -- workflows: logs and timeouts ------------------------------------------------------------


@pytest.mark.parametrize("machine", ["VerificationStateMachine", "ReleaseStateMachine"])
def test_state_machine_logs_its_executions_and_every_task_times_out(
    template: dict[str, Any], machine: str
) -> None:
    properties = template["Resources"][machine]["Properties"]
    # GIVEN its logging: every event, to a log group of this stack kept 30 days
    logging = properties.get("Logging")
    assert logging is not None, f"{machine} has no Logging"
    assert logging["Level"] == "ALL"
    (destination,) = logging["Destinations"]
    group_arn = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]
    group = template["Resources"][group_arn.value.removesuffix(".Arn")]
    assert group["Properties"]["LogGroupName"].value.startswith("/aws/vendedlogs/states/")
    assert group["Properties"]["RetentionInDays"] == 30
    # THEN every Task gives up after its TimeoutSeconds, past the step function's own timeout
    # (so an overrunning step fails with Lambda's error), and the execution has its own bound
    definition = json.loads((ROOT / properties["DefinitionUri"]).read_text())
    step_timeout = _functions(template)["WorkflowStepFunction"]["Properties"]["Timeout"]
    tasks = {n: s for n, s in definition["States"].items() if s["Type"] == "Task"}
    assert tasks
    for name, task in tasks.items():
        assert "TimeoutSeconds" in task, f"{machine}: Task {name} has no TimeoutSeconds"
        assert step_timeout < task["TimeoutSeconds"] <= step_timeout + 60, name
    # the longest run of every step's attempts and waits fits in the execution's timeout
    retry = next(r for task in tasks.values() for r in task["Retry"] if r["MaxAttempts"] > 0)
    waits = sum(
        retry["IntervalSeconds"] * retry["BackoffRate"] ** k for k in range(retry["MaxAttempts"])
    )
    (task_timeout,) = {task["TimeoutSeconds"] for task in tasks.values()}
    longest = len(tasks) * ((retry["MaxAttempts"] + 1) * task_timeout + waits)
    assert longest < definition["TimeoutSeconds"] <= 3600


# -- concurrency -----------------------------------------------------------------------------


def test_the_sweep_runs_one_tick_at_a_time_unless_the_account_cannot_reserve(
    template: dict[str, Any],
) -> None:
    sweep = _functions(template)["SweepFunction"]["Properties"]
    assert sweep.get("ReservedConcurrentExecutions") == Tag(
        "If", ["ReservesConcurrency", 1, NO_VALUE]
    )
    # a late tick is dropped within a minute, not run after the next one
    config = sweep["EventInvokeConfig"]
    assert (config["MaximumRetryAttempts"], config["MaximumEventAgeInSeconds"]) == (0, 60)


def test_every_reservation_depends_on_reserve_concurrency(template: dict[str, Any]) -> None:
    parameter = template["Parameters"]["ReserveConcurrency"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("true", ["true", "false"])
    assert template["Conditions"]["ReservesConcurrency"] == Tag(
        "Equals", [Tag("Ref", "ReserveConcurrency"), "true"]
    )
    reserving = 0
    for name, function in _functions(template).items():
        reserved = function["Properties"].get("ReservedConcurrentExecutions")
        if reserved is None:
            continue
        reserving += 1
        assert isinstance(reserved, Tag) and reserved.name == "If", name
        condition, value, otherwise = reserved.value
        assert (condition, otherwise) == ("ReservesConcurrency", NO_VALUE), name
        assert value == 1 or (isinstance(value, Tag) and value.name == "Ref"), name
    assert reserving == len(_functions(template)) - 1  # all but the workflow step


# -- logs and deployments --------------------------------------------------------------------


def test_every_function_logs_json(template: dict[str, Any]) -> None:
    for name, function in _functions(template).items():
        config = _function_property(template, function, "LoggingConfig")
        assert config is not None and config.get("LogFormat") == "JSON", name


def test_every_function_deploys_through_its_alias_live_as_deployment_type_says(
    template: dict[str, Any],
) -> None:
    assert template["Parameters"]["DeploymentType"]["Default"] == "AllAtOnce"
    for name, function in _functions(template).items():
        assert _function_property(template, function, "AutoPublishAlias") == "live", name
        # a new layer or environment is a new version too, not only new code
        assert function["Properties"].get("AutoPublishAliasAllProperties") is True, name
    assert template["Globals"]["Function"]["DeploymentPreference"] == {
        "Type": Tag("Ref", "DeploymentType")
    }


def test_whatever_invokes_a_function_invokes_its_alias(template: dict[str, Any]) -> None:
    functions = set(_functions(template))
    # GIVEN every reference to a function outside its own definition: environments, state
    # machines' substitutions, outputs (SAM wires the schedules and API routes to the alias)
    references: list[tuple[str, Any]] = []
    for name, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        for key in ("Environment", "DefinitionSubstitutions"):
            if key in properties:
                references += [(name, properties[key])]
    references += [
        (f"output {name}", output["Value"]) for name, output in template["Outputs"].items()
    ]
    for where, node in references:
        for ref in _refs(node):
            # THEN a function is named by its alias, never by its bare name ($LATEST)
            assert ref not in functions, f"{where} invokes {ref} outside its alias"
    getatts = [t for _, node in references for t in _getatts(node)]
    assert not [t for t in getatts if t.split(".")[0] in functions and t.endswith(".Arn")]


def _getatts(node: Any) -> list[str]:
    if isinstance(node, Tag):
        return [node.value] if node.name == "GetAtt" else _getatts(node.value)
    if isinstance(node, dict):
        return [g for value in node.values() for g in _getatts(value)]
    if isinstance(node, list):
        return [g for value in node for g in _getatts(value)]
    return []


# -- the edge and the file system ------------------------------------------------------------


def test_the_http_api_throttles_at_its_parameters(template: dict[str, Any]) -> None:
    settings = template["Resources"]["OperatorHttpApi"]["Properties"]["DefaultRouteSettings"]
    assert settings == {
        "ThrottlingRateLimit": Tag("Ref", "ApiThrottlingRateLimit"),
        "ThrottlingBurstLimit": Tag("Ref", "ApiThrottlingBurstLimit"),
    }


@pytest.mark.parametrize("path", ["template.yaml", "infra/network.yaml"])
def test_the_state_file_system_admits_only_tls_and_iam_clients(path: str) -> None:
    (file_system,) = _resources(_load(path), "AWS::EFS::FileSystem").values()
    policy = file_system["Properties"].get("FileSystemPolicy")
    assert policy is not None, f"{path}: the file system has no FileSystemPolicy"
    statements = policy["Statement"]
    deny = [s for s in statements if s["Effect"] == "Deny"]
    assert [s["Condition"] for s in deny] == [{"Bool": {"aws:SecureTransport": "false"}}]
    (allow,) = [s for s in statements if s["Effect"] == "Allow"]
    # the account's IAM principals (what their roles grant), never anonymous NFS clients
    assert allow["Principal"] == {
        "AWS": Tag("Sub", "arn:${AWS::Partition}:iam::${AWS::AccountId}:root")
    }
    assert allow["Condition"] == {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}
    assert "elasticfilesystem:ClientRootAccess" not in allow["Action"]
