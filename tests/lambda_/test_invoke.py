"""``rhumbatron invoke``: a template's function resolved and run here, as Lambda would run it.

Small templates written into a temp dir hold functions whose handlers report what they see
(their environment, the context's remaining time), so each test reads what the function was
given. Functions that touch neither NATS nor S3 need no local stack: the CLI tests give it
unreachable URLs instead. One test starts the real stack through the command, and keeps it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.cli import main
from rhumbatron_dev.local.invoke import (
    InvokeError,
    LocalTarget,
    load_template,
    local_environment,
    run_handler,
    sample_events,
)
from stack_processes import IGNORING_SIGINT, port_open

NOWHERE_NATS = "nats://127.0.0.1:1"
NOWHERE_S3 = "http://127.0.0.1:1"

TEMPLATE = """\
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Parameters:
  NatsUrl:
    Type: String
  LogLevel:
    Type: String
    Default: INFO
  Colour:
    Type: String
Conditions:
  Verbose: !Equals [!Ref LogLevel, DEBUG]
Globals:
  Function:
    Runtime: python3.13
    Handler: app.lambda_handler
    Timeout: 30
    MemorySize: 256
    Environment:
      Variables:
        SHARED: from-globals
        OVERRIDDEN: from-globals
        RHUMBATRON_NATS_URL: !Ref NatsUrl
        RHUMBATRON_STATE_DIR: /mnt/state
        RHUMBATRON_STREAM_REPLICAS: "3"
        RHUMBATRON_REQUIRE_DURABLE_JETSTREAM: "true"
Resources:
  Evidence:
    Type: AWS::S3::Bucket
  Other:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/other/
  Echo:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/echo/
      Timeout: 5
      Environment:
        Variables:
          OVERRIDDEN: from-function
          POWERTOOLS_LOG_LEVEL: !Ref LogLevel
          BUCKET: !Ref Evidence
          ARCHIVE: !Sub "${Evidence.Arn}/events/*"
          STACK: !Sub "${AWS::StackName}-${AWS::Region}"
          LONG_FORM: {"Fn::Join": ["-", [{"Ref": "LogLevel"}, "x"]]}
          NUDGE: !Ref Other
          MAYBE: !If [Verbose, "yes", !Ref "AWS::NoValue"]
          COLOUR: !Ref Colour
          RHUMBATRON_WORKFLOW_ENGINE: step_functions
"""

# Reports what the function sees; a second function may import it under the same name.
ECHO_APP = """\
import os

def lambda_handler(event, context):
    return {
        "event": event,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("RHUMBATRON_", "AWS_", "POWERTOOLS_"))
                or k in ("SHARED", "OVERRIDDEN", "BUCKET", "ARCHIVE", "STACK", "NUDGE",
                         "MAYBE", "COLOUR", "LONG_FORM")},
        "remaining_ms": context.get_remaining_time_in_millis(),
        "function_name": context.function_name,
        "memory": context.memory_limit_in_mb,
        "module_file": __file__,
        "extra": os.environ.get("EXTRA"),
    }
"""

OTHER_APP = """\
def lambda_handler(event, context):
    if event.get("fail"):
        raise ValueError(f"asked to fail with {event['fail']!r}")
    return {"who": "other"}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A SAM project: template.yaml, two functions whose modules are both ``app``, events."""
    (tmp_path / "template.yaml").write_text(TEMPLATE)
    for role, source in (("echo", ECHO_APP), ("other", OTHER_APP)):
        (tmp_path / "functions" / role).mkdir(parents=True)
        (tmp_path / "functions" / role / "app.py").write_text(source)
    events = tmp_path / "events"
    events.mkdir()
    for name in ("echo.json", "echo_big.json", "other_fail.json", "echoes.json"):
        (events / name).write_text(json.dumps({"from": name}))
    return tmp_path


def _target(root: Path) -> LocalTarget:
    return LocalTarget(
        nats_url=NOWHERE_NATS,
        nats_monitor_urls="http://127.0.0.1:2",
        s3_endpoint_url=NOWHERE_S3,
        state_root=root,
    )


# -- the template --------------------------------------------------------------------------------


def test_unknown_function_is_refused_naming_the_functions_there_are(project: Path) -> None:
    # GIVEN the template  WHEN a function it does not hold (or a bucket) is asked for
    template = load_template(project / "template.yaml")
    for wrong in ("Nope", "Evidence"):
        with pytest.raises(InvokeError) as refused:
            template.function(wrong)

        # THEN the error names the ID and every function of the template
        assert repr(wrong) in str(refused.value)
        assert "Echo, Other" in str(refused.value)


def test_function_properties_fall_back_to_globals(project: Path) -> None:
    # GIVEN a function that sets its Timeout and some variables, and one that sets neither
    template = load_template(project / "template.yaml")

    # WHEN both are resolved
    echo, other = template.function("Echo"), template.function("Other")

    # THEN what a function sets wins, the rest comes from Globals
    assert (echo.handler, echo.timeout_s, echo.memory_mb) == ("app.lambda_handler", 5, 256)
    assert (other.handler, other.timeout_s, other.memory_mb) == ("app.lambda_handler", 30, 256)
    assert echo.code_dir == project / "functions" / "echo"
    assert echo.environment["OVERRIDDEN"] == "from-function"
    assert echo.environment["SHARED"] == "from-globals"
    assert other.environment["OVERRIDDEN"] == "from-globals"
    assert echo.environment["NUDGE"] == {"Ref": "Other"}  # short tags read as long form


def test_sample_events_belong_to_the_longest_role_that_names_them(project: Path) -> None:
    # GIVEN events echo.json, echo_big.json, echoes.json and other_fail.json
    template = load_template(project / "template.yaml")

    # WHEN each function's samples are listed
    echo = sample_events(template, "Echo", project / "events")
    other = sample_events(template, "Other", project / "events")

    # THEN <role>.json and <role>_<case>.json are a role's, echoes.json is nobody's
    assert [p.name for p in echo] == ["echo.json", "echo_big.json"]
    assert [p.name for p in other] == ["other_fail.json"]


# -- the local environment -----------------------------------------------------------------------


def test_environment_points_at_the_local_stack_and_resolves_what_it_can(project: Path) -> None:
    # GIVEN the Echo function and a local target rooted in a temp dir
    template = load_template(project / "template.yaml")
    spec = template.function("Echo")
    root = project / "invoke"

    # WHEN its environment is resolved for the target, with the Colour parameter given
    env = local_environment(template, spec, _target(root), parameters={"Colour": "blue"})

    # THEN the stack's URLs, the mount, the local settings and resolvable intrinsics are in
    variables = env.variables
    assert variables["RHUMBATRON_NATS_URL"] == NOWHERE_NATS
    assert variables["RHUMBATRON_S3_ENDPOINT_URL"] == NOWHERE_S3
    assert variables["RHUMBATRON_STATE_DIR"] == str(root / "state")
    assert variables["RHUMBATRON_STREAM_REPLICAS"] == "1"
    assert variables["RHUMBATRON_REQUIRE_DURABLE_JETSTREAM"] == "false"
    assert variables["RHUMBATRON_WORKFLOW_ENGINE"] == "in_process"
    assert variables["POWERTOOLS_LOG_LEVEL"] == "INFO"
    assert variables["LONG_FORM"] == "INFO-x"
    assert variables["COLOUR"] == "blue"
    assert variables["BUCKET"] == "rhumbatron-local-evidence"
    assert variables["ARCHIVE"] == "arn:aws:s3:::rhumbatron-local-evidence/events/*"
    assert variables["STACK"] == "rhumbatron-local-us-east-1"
    assert env.buckets == ("rhumbatron-local-evidence",)
    # ... what exists only when deployed is unset, and so is a dropped (NoValue) property
    assert "NUDGE" not in variables
    assert "MAYBE" not in variables
    # ... Lambda's own variables are there as sam local sets them
    assert variables["AWS_SAM_LOCAL"] == "true"
    assert variables["AWS_LAMBDA_FUNCTION_NAME"] == "Echo"
    assert variables["AWS_LAMBDA_FUNCTION_TIMEOUT"] == "5"
    # ... and every change is reported with its reason; unchanged values are not
    mapped = {m.name: m for m in env.mappings}
    assert mapped["NUDGE"].template_value == "!Ref Other"
    assert mapped["NUDGE"].local_value is None
    assert "AWS::Serverless::Function" in mapped["NUDGE"].reason
    assert (
        mapped["RHUMBATRON_STATE_DIR"]
        .describe()
        .startswith(f"RHUMBATRON_STATE_DIR: /mnt/state -> {root / 'state'}")
    )
    assert mapped["RHUMBATRON_S3_ENDPOINT_URL"].template_value is None
    assert "SHARED" not in mapped


def test_parameter_without_default_is_unset_with_a_hint_and_unknown_ones_are_refused(
    project: Path,
) -> None:
    # GIVEN the Echo function, whose COLOUR is a parameter without a Default
    template = load_template(project / "template.yaml")
    spec = template.function("Echo")

    # WHEN it is resolved without the parameter
    env = local_environment(template, spec, _target(project))

    # THEN the variable is unset, and the report says how to give it
    assert "COLOUR" not in env.variables
    colour = next(m for m in env.mappings if m.name == "COLOUR")
    assert "--parameter Colour=VALUE" in colour.reason

    # WHEN a parameter the template does not declare is given THEN it is refused by name
    with pytest.raises(InvokeError, match=r"Colur.*declares: Colour, LogLevel, NatsUrl"):
        local_environment(template, spec, _target(project), parameters={"Colur": "red"})


# -- running the handler -------------------------------------------------------------------------


def test_handler_runs_with_the_resolved_environment_and_counts_down_its_timeout(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the calling shell has a setting of its own, and a clock that moves 2 s per read
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", "/somewhere/else")
    monkeypatch.setenv("RHUMBATRON_JOURNAL_MODE", "WAL")
    ticks = iter(float(t) for t in range(0, 100, 2))
    template = load_template(project / "template.yaml")
    spec = template.function("Echo")
    env = local_environment(template, spec, _target(project / "invoke"))
    before = dict(os.environ)

    # WHEN the handler runs with an event
    invocation = run_handler(template, spec, {"n": 1}, env, monotonic=lambda: next(ticks))

    # THEN it saw the event, the function's variables and none of the shell's settings
    assert invocation.error is None
    result = invocation.result
    assert result["event"] == {"n": 1}
    assert result["env"]["RHUMBATRON_STATE_DIR"] == str(project / "invoke" / "state")
    assert "RHUMBATRON_JOURNAL_MODE" not in result["env"]
    assert result["env"]["OVERRIDDEN"] == "from-function"
    # ... a context with its name, memory, and the Timeout counting down on that clock
    assert (result["function_name"], result["memory"]) == ("Echo", 256)
    assert result["remaining_ms"] == 3_000  # 5 s Timeout, read 2 s after the start
    assert result["module_file"] == str(project / "functions" / "echo" / "app.py")
    # ... and afterwards the environment is the shell's again, the module forgotten
    assert dict(os.environ) == before
    assert "app" not in sys.modules
    # ... and, by that clock, it ran 6 s of its 5 s: Lambda would have stopped it
    assert invocation.duration_s == 6.0
    assert invocation.timed_out


def test_two_functions_with_the_same_module_name_each_run_their_own(project: Path) -> None:
    # GIVEN two functions whose handlers are both app.lambda_handler
    template = load_template(project / "template.yaml")
    results = {}

    # WHEN one runs after the other
    for name in ("Echo", "Other"):
        spec = template.function(name)
        env = local_environment(template, spec, _target(project))
        results[name] = run_handler(template, spec, {}, env).result

    # THEN each ran its own app.py (as two containers would)
    assert "module_file" in results["Echo"]
    assert results["Other"] == {"who": "other"}


def test_handler_exception_is_returned_as_a_lambda_error(project: Path) -> None:
    # GIVEN a handler that raises for this event
    template = load_template(project / "template.yaml")
    spec = template.function("Other")
    env = local_environment(template, spec, _target(project))

    # WHEN it runs
    invocation = run_handler(template, spec, {"fail": "on purpose"}, env)

    # THEN the invocation carries Lambda's error object instead of raising
    assert invocation.result is None
    assert invocation.error is not None
    assert invocation.error["errorType"] == "ValueError"
    assert invocation.error["errorMessage"] == "asked to fail with 'on purpose'"
    assert invocation.response() == invocation.error


def test_built_layout_runs_the_handler_with_the_built_layers_first(tmp_path: Path) -> None:
    # GIVEN a built template: a function folder, a pure-Python layer and a layer built for
    # another platform (a compiled module of another CPython)
    (tmp_path / "Fn").mkdir()
    (tmp_path / "Fn" / "app.py").write_text(
        "import sys, helper\n"
        "def lambda_handler(event, context):\n"
        "    return {'helper': helper.__file__, 'executable': sys.executable}\n"
    )
    (tmp_path / "Pure" / "python").mkdir(parents=True)
    (tmp_path / "Pure" / "python" / "helper.py").write_text("")
    (tmp_path / "Foreign" / "python" / "fast").mkdir(parents=True)
    (tmp_path / "Foreign" / "python" / "fast" / "_x.cpython-313-aarch64-linux-gnu.so").write_bytes(
        b"\x7fELF"
    )
    (tmp_path / "template.yaml").write_text(
        textwrap.dedent(
            """\
            Resources:
              Pure: {Type: AWS::Serverless::LayerVersion, Properties: {ContentUri: Pure}}
              Foreign: {Type: AWS::Serverless::LayerVersion, Properties: {ContentUri: Foreign}}
              Fn:
                Type: AWS::Serverless::Function
                Properties:
                  CodeUri: Fn
                  Handler: app.lambda_handler
                  Layers: [!Ref Foreign, !Ref Pure]
            """
        )
    )
    template = load_template(tmp_path / "template.yaml")
    spec = template.function("Fn")
    env = local_environment(template, spec, _target(tmp_path))

    # WHEN it is invoked
    invocation = run_handler(template, spec, {}, env)

    # THEN it ran in a child interpreter with the pure layer importable, the foreign one not
    assert invocation.error is None, invocation.error
    assert invocation.result == {
        "helper": str(tmp_path / "Pure" / "python" / "helper.py"),
        "executable": sys.executable,
    }
    assert spec.layers == ("Foreign", "Pure")


# -- the command ---------------------------------------------------------------------------------


def _invoke(project: Path, *args: str, s3: bool = False) -> int:
    """The command with no NATS to reach, and no S3 either unless ``s3`` (moto starts)."""
    return main(
        [
            *("invoke", *args, "--template", str(project / "template.yaml")),
            *("--root", str(project / "invoke"), "--nats-url", NOWHERE_NATS),
            *(() if s3 else ("--s3-endpoint-url", NOWHERE_S3)),
        ]
    )


def test_command_prints_the_response_on_stdout_and_the_mapping_on_stderr(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the Echo function, a parameter and an --env-vars file in sam local's format
    env_vars = project / "env.json"
    env_vars.write_text(
        json.dumps(
            {
                "Parameters": {"SHARED": "for-all", "UNDECLARED": "dropped"},
                "Echo": {"OVERRIDDEN": "from-file", "EXTRA": 7, "POWERTOOLS_LOG_LEVEL": None},
            }
        )
    )

    # WHEN it is invoked from the command line
    status = _invoke(
        project,
        *("Echo", "--event", str(project / "events" / "echo.json")),
        *("--parameter", "Colour=red", "--env-vars", str(env_vars)),
        s3=True,  # Echo uses a bucket: the command starts moto's S3 and makes it
    )

    # THEN the response alone is on stdout
    out, err = capsys.readouterr()
    assert status == 0, err
    response = json.loads(out)
    assert response["event"] == {"from": "echo.json"}
    env = response["env"]
    # ... the function saw the parameter and the overrides (Parameters only where declared,
    # its own section also adding and, with null, unsetting)
    assert env["COLOUR"] == "red"
    assert (env["SHARED"], env["OVERRIDDEN"]) == ("for-all", "from-file")
    assert "UNDECLARED" not in env
    assert "POWERTOOLS_LOG_LEVEL" not in env
    assert response["extra"] == "7"
    assert env["BUCKET"] == "rhumbatron-local-evidence"
    # ... and stderr says what was mapped, and why
    assert "Echo: app.lambda_handler" in err
    assert f"NATS {NOWHERE_NATS}, S3 http://127.0.0.1:" in err
    assert f"mapped RHUMBATRON_STATE_DIR: /mnt/state -> {project / 'invoke' / 'state'}" in err
    assert "mapped OVERRIDDEN: from-function -> from-file  (given by --env-vars)" in err


def test_command_exit_status_tells_a_failed_handler_from_a_wrong_name(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an event that makes the Other function raise
    event = project / "events" / "other_fail.json"
    event.write_text(json.dumps({"fail": "now"}))

    # WHEN it is invoked, then an unknown function, then a missing event file
    failed = _invoke(project, "Other", "--event", str(event))
    failed_out = capsys.readouterr().out
    unknown = _invoke(project, "Othre", "--event", str(event))
    unknown_err = capsys.readouterr().err
    missing = _invoke(project, "Echo", "--event", str(project / "events" / "nope.json"))
    missing_err = capsys.readouterr().err

    # THEN a failed handler is 1 with Lambda's error object, the others 2 with a hint
    assert failed == 1
    assert json.loads(failed_out)["errorType"] == "ValueError"
    assert unknown == 2
    assert "'Othre' is not in the template" in unknown_err
    assert "its functions are: Echo, Other" in unknown_err
    assert missing == 2
    assert "samples for Echo:" in missing_err
    assert "echo_big.json" in missing_err


@pytest.mark.parametrize(
    ("stop", "launcher"),
    [
        (signal.SIGINT, ()),
        (signal.SIGTERM, ()),
        (signal.SIGINT, ("-c", IGNORING_SIGINT)),
    ],
    ids=["ctrl-c", "sigterm", "ctrl-c-started-with-sigint-ignored"],
)
def test_command_keeps_the_stack_until_interrupted_then_stops_it(
    project: Path, stop: signal.Signals, launcher: tuple[str, ...]
) -> None:
    # GIVEN the command started with --keep-stack (and no --nats-url: it starts the stack),
    # whose moto S3 server thread may be the thread the kernel hands the signal to
    event = project / "events" / "echo.json"
    command = [
        *(sys.executable, *launcher, "-m", "rhumbatron.cli", "invoke", "Echo"),
        *("--event", str(event), "--template", str(project / "template.yaml")),
        *("--root", str(project / "invoke"), "--keep-stack"),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=project
    )
    try:
        # WHEN it has answered and says the stack keeps running
        assert process.stderr is not None
        lines: list[str] = []
        for line in process.stderr:
            lines.append(line)
            if "keeps running" in line:
                break
        kept = lines[-1]
        nats_url = kept.split("--nats-url ", 1)[1].split()[0]
        s3_url = kept.split("--s3-endpoint-url ", 1)[1].split()[0]
        assert port_open(nats_url) and port_open(s3_url)

        # ... and is sent the signal (the timeout only bounds a regression: it stops at once)
        process.send_signal(stop)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    # THEN it exits cleanly with the response printed, and the stack is gone
    assert process.returncode == 0, "".join(lines) + err
    assert f"{stop.name}: stopping the stack" in err
    response: dict[str, Any] = json.loads(out)
    assert response["env"]["RHUMBATRON_NATS_URL"] == nats_url
    assert response["env"]["BUCKET"] == "rhumbatron-local-evidence"
    assert not port_open(nats_url)
    assert not port_open(s3_url)
