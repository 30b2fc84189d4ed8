"""Every function of template.yaml answers its sample events, run as ``rhumbatron invoke`` runs
it — from the sources, and from what ``sam build`` built.

The functions are the template's ``AWS::Serverless::Function`` resources as found when the
tests are collected, so a function added to the template is invoked here without a change to
this file; it needs a sample event (``events/<role>.json`` or ``events/<role>_<case>.json``).
All invocations share one local stack (nats-server + moto S3) and one state folder, seeded
with the world the sample events name: the sample scenario (``samplefiles/scenario.json``;
the alarm event's actor is one it writes) and the fork of the Candidate the workflow-step
events release. The API's sample requests carry a JWT signed with the sample HS256 secret
(template.yaml's header says so), given to the API as ``--env-vars`` overrides.

The built artifacts come from ``make sam-check`` (``sam validate --lint`` and a cached
``sam build``, which ``make test`` runs first); without a build, or with one older than the
sources, those tests are skipped and say so.
"""

from __future__ import annotations

import asyncio
import filecmp
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.core.settings import load_settings
from rhumbatron.lifecycle.forks import ForkStore
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.invoke import (
    Invocation,
    LocalTarget,
    Template,
    invoke,
    load_template,
    local_environment,
    local_target,
    read_env_vars,
    read_event,
    sample_events,
)
from rhumbatron_dev.scenario import load_scenario, run_scenario

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
BUILD = ROOT / ".aws-sam" / "build"
SOURCE = load_template(ROOT / "template.yaml")
FUNCTION_IDS = SOURCE.function_ids()
SAMPLES = {function: sample_events(SOURCE, function, EVENTS) for function in FUNCTION_IDS}
#: Every function with every one of its sample events.
CASES = [
    pytest.param(function, event.name, id=f"{function}-{event.stem}")
    for function, events in SAMPLES.items()
    for event in events
]
#: Every function with its first sample event: enough to prove the build imports and runs
#: (a built function runs in a child interpreter, which costs a second of imports).
BUILT_CASES = [
    pytest.param(function, events[0].name, id=f"{function}-{events[0].stem}")
    for function, events in SAMPLES.items()
    if events
]


#: The sample API events' JWT (HS256, see template.yaml's header), in the format of
#: `sam local invoke --env-vars`; null unsets the JWKS URL the template sets.
SAMPLE_JWT = {
    "RHUMBATRON_API_JWT_JWKS_URL": None,
    "RHUMBATRON_API_JWT_SECRET": "rhumbatron-sample-jwt-secret-for-local-invokes-only",
    "RHUMBATRON_API_JWT_ISSUER": "https://auth.rhumbatron.example/",
    "RHUMBATRON_API_JWT_AUDIENCE": "rhumbatron-api",
    # The sample events' tokens live until 2100, so that a local invoke works any day.
    "RHUMBATRON_API_JWT_MAX_LIFETIME_S": "3000000000",
}


@pytest.fixture(scope="module")
def env_vars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An --env-vars file giving every function that checks JWTs the sample secret."""
    path = tmp_path_factory.mktemp("env") / "env.json"
    jwt_functions = [
        function
        for function in FUNCTION_IDS
        if SOURCE.function(function).environment.get("RHUMBATRON_API_AUTH_MODE") == "jwt"
    ]
    path.write_text(json.dumps({function: SAMPLE_JWT for function in jwt_functions}))
    return path


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTarget]:
    """One local stack for the module, its state seeded with the sample events' world."""
    with local_target(tmp_path_factory.mktemp("invoke")) as stack:
        _seed(stack)
        yield stack


def _seed(stack: LocalTarget) -> None:
    """Write the sample scenario with the settings the functions get, into their state, and
    the fork of every Candidate a sample event names (verification wrote it, a release
    deploys it)."""
    spec = SOURCE.function(FUNCTION_IDS[0])
    variables = local_environment(SOURCE, spec, stack).variables
    settings = load_settings(
        **{
            name.removeprefix("RHUMBATRON_").lower(): value
            for name, value in variables.items()
            if name.startswith("RHUMBATRON_")
        }
    )
    app = bootstrap(settings)
    try:
        run_scenario(app, load_scenario(ROOT / "samplefiles" / "scenario.json"))
    finally:
        asyncio.run(app.close())
    forks = ForkStore(settings.state_dir / "forks")
    for path in sorted(EVENTS.glob("*.json")):
        event = read_event(path)
        named = event.get("input") if isinstance(event, dict) else None
        if isinstance(named, dict) and {"projectId", "candidate_id"} <= named.keys():
            forks.write(named["projectId"], named["candidate_id"], {"README.md": "sample\n"})


def _invoke(
    template: Template, target: LocalTarget, env_vars: Path, function: str, event: str
) -> Invocation:
    spec = template.function(function)
    overrides = read_env_vars(env_vars, function, spec.environment)
    return invoke(
        function, read_event(EVENTS / event), target, template=template, overrides=overrides
    )


def test_the_template_has_functions() -> None:
    # GIVEN template.yaml  THEN the tests below have functions to invoke
    assert FUNCTION_IDS
    assert CASES


@pytest.mark.parametrize("function", FUNCTION_IDS)
def test_every_function_has_a_sample_event(function: str) -> None:
    # GIVEN a function of the template  WHEN its sample events are looked up in events/
    samples = SAMPLES[function]

    # THEN there is at least one, and each is JSON
    role = SOURCE.function(function).code_dir.name
    assert samples, f"{function}: add events/{role}.json (or events/{role}_<case>.json)"
    for path in samples:
        read_event(path)


@pytest.mark.parametrize(("function", "event"), CASES)
def test_each_function_answers_each_of_its_sample_events(
    target: LocalTarget, env_vars: Path, function: str, event: str
) -> None:
    # GIVEN the local stack with the sample world, and a sample event of the function
    # WHEN the function is invoked with it, as `rhumbatron invoke` does
    invocation = _invoke(SOURCE, target, env_vars, function, event)

    # THEN it answers with JSON, within its Timeout, from the sources in this process
    assert invocation.error is None, invocation.error
    assert invocation.result is not None
    assert not invocation.timed_out
    assert invocation.layers == ()


# -- the built artifacts -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def built() -> Template:
    """The template `sam build` wrote, if its artifacts are those of the current sources."""
    if not (BUILD / "template.yaml").is_file():
        pytest.skip("no .aws-sam/build: run `make sam-check` (sam validate --lint, sam build)")
    template = load_template(BUILD / "template.yaml")
    stale = _stale(template)
    if stale:
        pytest.skip(f".aws-sam/build is older than the sources ({stale}): run `make sam-check`")
    return template


def _stale(template: Template) -> str:
    """What differs between the build and the sources, or ''."""
    if template.function_ids() != FUNCTION_IDS:
        return f"functions {template.function_ids()} != {FUNCTION_IDS}"
    for function in FUNCTION_IDS:
        source = SOURCE.function(function).code_dir
        artifact = template.function(function).code_dir
        names = sorted(p.name for p in source.glob("*.py"))
        _, mismatch, errors = filecmp.cmpfiles(source, artifact, names, shallow=False)
        if mismatch or errors:
            return f"{function}: {mismatch + errors}"
    package = ROOT / "shared" / "rhumbatron"
    layer = BUILD / "CodeLayer" / "python" / "rhumbatron"
    # The code layer is the package as it is (the development package stays out of it).
    names = [str(p.relative_to(package)) for p in package.rglob("*.py")]
    _, mismatch, errors = filecmp.cmpfiles(package, layer, names, shallow=False)
    if mismatch or errors:
        return f"CodeLayer: {(mismatch + errors)[:3]}"
    return ""


@pytest.mark.parametrize(("function", "event"), BUILT_CASES)
def test_each_built_function_answers_its_sample_event(
    built: Template, target: LocalTarget, env_vars: Path, function: str, event: str
) -> None:
    # GIVEN the function as `sam build` built it: its handler and the code layer
    # WHEN it is invoked with its sample event
    invocation = _invoke(built, target, env_vars, function, event)

    # THEN it answers, having imported the handler and `rhumbatron` from the build alone
    assert invocation.error is None, invocation.error
    assert invocation.result is not None
    assert not invocation.timed_out
    assert invocation.spec.code_dir == BUILD / function
    assert invocation.layers == (BUILD / "CodeLayer" / "python",)
