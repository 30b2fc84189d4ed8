"""A Docker-free ``sam local invoke``: one function of template.yaml, run for real, here.

``rhumbatron invoke <LogicalId> --event events/<file>.json`` reads the SAM template, finds the
``AWS::Serverless::Function`` with that logical ID (whatever functions the template holds),
and resolves what Lambda would run it with — ``Handler``, ``CodeUri``, ``Timeout``,
``MemorySize`` and ``Environment``, each from the function or else from ``Globals`` — then
imports the handler module from the function's folder and calls it with the event file's
JSON and a context object whose remaining time counts down from the ``Timeout``. The
``rhumbatron`` package and the third-party packages come from this interpreter (the repo's
``shared/`` through the editable install, and the venv), not from the layers.

The environment is the template's, resolved locally (:func:`local_environment`); what
cannot mean the same here is replaced, and every replacement is reported as an
:class:`EnvMapping`:

==========================================  =================================================
template value                              locally
==========================================  =================================================
``RHUMBATRON_NATS_URL`` (``!Ref NatsUrl``)  the embedded nats-server (or ``--nats-url``)
``RHUMBATRON_NATS_MONITOR_URLS``            its monitoring port (unset with ``--nats-url``)
``RHUMBATRON_S3_ENDPOINT_URL`` (added)      moto's S3 server (or ``--s3-endpoint-url``)
``RHUMBATRON_STREAM_REPLICAS``              ``1``: one local server cannot hold R3 streams
``RHUMBATRON_REQUIRE_DURABLE_JETSTREAM``    ``false``: the local server is no durable cluster
``RHUMBATRON_WORKFLOW_ENGINE``              ``in_process``: there is no Step Functions here
a path under ``/mnt/`` (``/mnt/state``)     the same path under ``--root`` (``<root>/state``)
``!Ref <AWS::S3::Bucket>`` / its ``.Arn``   a local bucket ``<stack>-<logical-id>``, created
``!Ref <parameter>``, ``!Sub``, ``!If`` …   resolved from the parameter's Default (or
                                            ``--parameter NAME=VALUE``) and pseudo parameters
any other resource (a function's name or    unset: it exists only in the deployed stack (so
``.Alias``, a state machine's or a          the publisher does not nudge the router Lambda;
secret's ARN)                               workflows run in process)
==========================================  =================================================

Then ``--env-vars FILE`` (``sam local invoke``'s JSON: ``{"Parameters": {...},
"<LogicalId>": {...}}``, :func:`read_env_vars`) overrides variables, as the API's sample
events need (their JWT is signed with a local secret). Lambda's own variables are set as
``sam local invoke`` sets them (``AWS_SAM_LOCAL=true``, which also keeps Powertools' tracer
off, ``AWS_LAMBDA_FUNCTION_NAME``, ``AWS_REGION`` …);
``RHUMBATRON_*`` and ``POWERTOOLS_*`` variables of the calling shell are hidden for the run,
since a Lambda sees only its configuration. Everything is restored afterwards.

Each invocation is a cold start: the process's shared Lambda runtime
(:mod:`rhumbatron.entrypoints._lambda`) is reset before the call and closed after it (its
NATS connection drained before the local stack stops), and the handler module is imported
afresh. With the template ``sam build`` writes (``.aws-sam/build/template.yaml``) the code
is the built artifacts: the handler from the function's build folder and the pure-Python
layers (the code layer) from theirs, in a child interpreter so that ``rhumbatron`` comes from
the layer; a layer built for another platform (the dependency layer's arm64 CPython 3.13
wheels) is left out and its packages come from this interpreter.

What this does not give: Lambda's Python version and architecture (this interpreter runs
it), the Timeout enforced (an overrun is reported, not killed), memory limits, IAM.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.machinery
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from rhumbatron.errors import ConfigurationError, LocalStackError, RhumbatronError

__all__ = [
    "DEFAULT_ROOT",
    "EnvMapping",
    "FunctionSpec",
    "Invocation",
    "InvokeError",
    "LocalEnvironment",
    "LocalLambdaContext",
    "LocalTarget",
    "Template",
    "invoke",
    "load_template",
    "local_environment",
    "local_target",
    "read_env_vars",
    "read_event",
    "run_command",
    "run_handler",
    "sample_events",
]

#: Where ``rhumbatron invoke`` keeps the local stack's store and the functions' state.
DEFAULT_ROOT = Path(".rhumbatron/invoke")

_FUNCTION_TYPE = "AWS::Serverless::Function"
_LAYER_TYPE = "AWS::Serverless::LayerVersion"
_BUCKET_TYPE = "AWS::S3::Bucket"
# Lambda mounts file systems only under /mnt/ (LocalMountPath must start with it).
_MOUNT_PREFIX = "/mnt/"
_DEFAULT_TIMEOUT_S = 3  # Lambda's and SAM's default
_DEFAULT_MEMORY_MB = 128
_LOCAL_REGION = "us-east-1"
_LOCAL_ACCOUNT = "123456789012"
_DEFAULT_STACK = "rhumbatron-local"

#: Settings whose template value cannot work against one local nats-server, and why.
_LOCAL_SETTINGS: dict[str, tuple[str, str]] = {
    "RHUMBATRON_STREAM_REPLICAS": ("1", "one local nats-server cannot hold replicated streams"),
    "RHUMBATRON_REQUIRE_DURABLE_JETSTREAM": (
        "false",
        "the local nats-server is no 3-node cluster with sync_interval: always, which the "
        "start-up durability check requires",
    ),
    "RHUMBATRON_WORKFLOW_ENGINE": (
        "in_process",
        "there is no Step Functions locally: the workflows run in this process",
    ),
}
_NATS_URL = "RHUMBATRON_NATS_URL"
_NATS_MONITOR_URLS = "RHUMBATRON_NATS_MONITOR_URLS"
_S3_ENDPOINT_URL = "RHUMBATRON_S3_ENDPOINT_URL"
# A Lambda sees only its configuration: these prefixes of the calling shell are hidden.
_HIDDEN_PREFIXES = ("RHUMBATRON_", "POWERTOOLS_")


class InvokeError(ConfigurationError):
    """The template, the logical ID, a parameter or the event file cannot be invoked locally;
    the message names the bad value and what exists instead."""


# -- the template ------------------------------------------------------------------------------


class _CloudFormationLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML is untyped
    """A safe loader that reads the short intrinsics (``!Ref X``) as their long form
    (``{"Ref": "X"}``), so both spellings resolve alike."""


def _construct_intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    name = suffix if suffix in ("Ref", "Condition") else f"Fn::{suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if name == "Fn::GetAtt":  # !GetAtt Resource.Attribute
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_CloudFormationLoader.add_multi_constructor("!", _construct_intrinsic)


@dataclass(frozen=True)
class FunctionSpec:
    """One function as Lambda would run it: what the template and its Globals say."""

    logical_id: str
    code_dir: Path
    handler: str
    timeout_s: int
    memory_mb: int
    runtime: str | None
    #: The merged ``Environment.Variables``, intrinsics unresolved (long form).
    environment: Mapping[str, Any]
    #: The layers' logical IDs, in the function's order.
    layers: tuple[str, ...]

    @property
    def module(self) -> str:
        """The handler's module (``app`` of ``app.lambda_handler``)."""
        return self.handler.rsplit(".", 1)[0].replace("/", ".")

    @property
    def attribute(self) -> str:
        """The handler's function name (``lambda_handler``)."""
        return self.handler.rsplit(".", 1)[1]


@dataclass(frozen=True)
class Template:
    """A loaded SAM template; paths in it are relative to :attr:`path`'s folder."""

    path: Path
    document: Mapping[str, Any]
    stack_name: str = _DEFAULT_STACK

    @property
    def directory(self) -> Path:
        return self.path.parent

    @property
    def resources(self) -> Mapping[str, Mapping[str, Any]]:
        resources: Mapping[str, Mapping[str, Any]] = self.document.get("Resources") or {}
        return resources

    def function_ids(self) -> list[str]:
        """Every ``AWS::Serverless::Function``'s logical ID, sorted."""
        return sorted(k for k, r in self.resources.items() if r.get("Type") == _FUNCTION_TYPE)

    def function(self, logical_id: str) -> FunctionSpec:
        """The function ``logical_id``, its properties merged over ``Globals.Function``.

        Raises :class:`InvokeError` for an unknown ID (listing the functions there are), a
        code location that is no local folder, or a handler it cannot name.
        """
        resource = self.resources.get(logical_id)
        if resource is None or resource.get("Type") != _FUNCTION_TYPE:
            what = "not a function" if resource is not None else "not in the template"
            raise InvokeError(
                f"{logical_id!r} is {what} ({self.path}); its functions are: "
                f"{', '.join(self.function_ids()) or 'none'}"
            )
        props: Mapping[str, Any] = resource.get("Properties") or {}
        globals_: Mapping[str, Any] = (self.document.get("Globals") or {}).get("Function") or {}
        resolver = _Resolver(self, {})

        def prop(name: str, default: Any = None) -> Any:
            return props[name] if name in props else globals_.get(name, default)

        if prop("PackageType", "Zip") != "Zip" or "InlineCode" in props:
            raise InvokeError(f"{logical_id}: only a Zip function with a CodeUri folder runs here")
        code_uri = prop("CodeUri")
        if not isinstance(code_uri, str):
            raise InvokeError(
                f"{logical_id}: CodeUri {code_uri!r} is not a local folder; point it at "
                "functions/<role>/"
            )
        code_dir = (self.directory / code_uri).resolve()
        if not code_dir.is_dir():
            raise InvokeError(f"{logical_id}: CodeUri folder {code_dir} does not exist")
        handler = prop("Handler")
        if not isinstance(handler, str) or "." not in handler:
            raise InvokeError(
                f"{logical_id}: Handler {handler!r} is not <module>.<function> (app.lambda_handler)"
            )
        environment = dict(((globals_.get("Environment") or {}).get("Variables")) or {})
        environment.update(((props.get("Environment") or {}).get("Variables")) or {})
        try:
            layers = tuple(
                layer["Ref"]
                for layer in resolver.value(prop("Layers", []), keep_refs=True) or []
                if isinstance(layer, dict) and "Ref" in layer
            )
            timeout_s = int(resolver.value(prop("Timeout", _DEFAULT_TIMEOUT_S)))
            memory_mb = int(resolver.value(prop("MemorySize", _DEFAULT_MEMORY_MB)))
        except (_Unresolvable, _NoValue, TypeError, ValueError) as exc:
            raise InvokeError(f"{logical_id}: Layers, Timeout or MemorySize: {exc}") from exc
        return FunctionSpec(
            logical_id=logical_id,
            code_dir=code_dir,
            handler=handler,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            runtime=prop("Runtime"),
            environment=environment,
            layers=layers,
        )

    def layer_dir(self, logical_id: str) -> Path | None:
        """A layer's ``python/`` folder, if the layer's content has one (a built layer)."""
        resource = self.resources.get(logical_id) or {}
        if resource.get("Type") != _LAYER_TYPE:
            return None
        content = (resource.get("Properties") or {}).get("ContentUri")
        if not isinstance(content, str):
            return None
        python = (self.directory / content / "python").resolve()
        return python if python.is_dir() else None


def load_template(path: Path | str = "template.yaml", *, samconfig: Path | None = None) -> Template:
    """Read a SAM template (YAML or JSON, short or long intrinsics).

    The stack name (``AWS::StackName``) comes from ``samconfig.toml`` beside the template
    (beside the project's, for the template ``sam build`` wrote). Raises
    :class:`InvokeError` for a missing or unreadable file.
    """
    template_path = Path(path).resolve()
    try:
        document = yaml.load(template_path.read_text(), Loader=_CloudFormationLoader)
    except OSError as exc:
        raise InvokeError(f"cannot read the template {template_path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise InvokeError(f"{template_path} is not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or "Resources" not in document:
        raise InvokeError(f"{template_path} has no Resources: it is not a SAM template")
    return Template(template_path, document, _stack_name(template_path, samconfig))


def _stack_name(template_path: Path, samconfig: Path | None) -> str:
    folder = template_path.parent
    if folder.name == "build" and folder.parent.name == ".aws-sam":
        folder = folder.parent.parent  # the template `sam build` wrote: the project's config
    candidate = samconfig or folder / "samconfig.toml"
    if candidate.is_file():
        config = tomllib.loads(candidate.read_text()).get("default", {})
        for command in ("global", "deploy"):
            name = config.get(command, {}).get("parameters", {}).get("stack_name")
            if isinstance(name, str) and name:
                return name
    return _DEFAULT_STACK


def sample_events(template: Template, logical_id: str, events_dir: Path) -> list[Path]:
    """The function's sample events: ``<role>.json`` or ``<role>_<case>.json`` in
    ``events_dir``, where a function's roles are its folder's name (``functions/<role>/``)
    and its logical ID in snake case without ``Function`` (``SweepFunction`` → ``sweep``).

    An event belongs to the longest role of the template that prefixes it, so
    ``router_nudge.json`` is no sample of a function whose role is ``router``.
    """
    roles = {f: _roles(template.function(f)) for f in template.function_ids()}
    mine = roles[logical_id] if logical_id in roles else _roles(template.function(logical_id))
    every = set().union(*roles.values())
    found = []
    for path in sorted(events_dir.glob("*.json")):
        matching = [r for r in every if path.stem == r or path.stem.startswith(r + "_")]
        if matching and max(matching, key=len) in mine:
            found.append(path)
    return found


def _roles(spec: FunctionSpec) -> set[str]:
    return {spec.code_dir.name, _snake(spec.logical_id.removesuffix("Function"))}


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


# -- intrinsics --------------------------------------------------------------------------------


class _Unresolvable(Exception):
    """An intrinsic that has no local value; the message says why."""


class _NoValue(Exception):
    """``!Ref AWS::NoValue``: CloudFormation drops the property."""


@dataclass
class _Resolver:
    """Resolves intrinsics from parameters (Default or override), pseudo parameters and
    S3 buckets (local names); every other resource is :class:`_Unresolvable`."""

    template: Template
    overrides: Mapping[str, str]
    region: str = _LOCAL_REGION
    buckets: dict[str, str] = field(default_factory=dict)  # logical ID -> local bucket name

    def value(self, node: Any, *, keep_refs: bool = False) -> Any:
        if isinstance(node, list):
            return [self.value(item, keep_refs=keep_refs) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, arg),) = node.items()
            if key == "Ref" and keep_refs and arg in self.template.resources:
                return node
            if key == "Ref":
                return self._ref(arg)
            if key.startswith("Fn::") or key == "Condition":
                return self._function(key, arg)
        return {key: self.value(item, keep_refs=keep_refs) for key, item in node.items()}

    def _function(self, key: str, arg: Any) -> Any:
        if key == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            return re.sub(
                r"\$\{([^}]+)\}", lambda m: self._sub_variable(m.group(1), variables), text
            )
        if key == "Fn::Join":
            delimiter, items = arg
            return str(delimiter).join(_string(item) for item in self._list(items))
        if key == "Fn::Select":
            index, items = arg
            return self._list(items)[int(self.value(index))]
        if key == "Fn::Split":
            delimiter, text = arg
            return str(self.value(text)).split(delimiter)
        if key == "Fn::If":
            condition, when_true, when_false = arg
            return self.value(when_true if self.condition(condition) else when_false)
        if key == "Fn::FindInMap":
            name, first, second = (self.value(item) for item in arg[:3])
            try:
                return self.template.document["Mappings"][name][first][second]
            except (KeyError, TypeError) as exc:
                raise _Unresolvable(f"no mapping {name}.{first}.{second}") from exc
        if key == "Fn::GetAtt":
            resource, attribute = arg if isinstance(arg, list) else str(arg).split(".", 1)
            return self._get_att(resource, attribute)
        if key == "Condition":
            return self.condition(arg)
        raise _Unresolvable(f"{_render({key: arg})} has no local value")

    def _sub_variable(self, name: str, variables: Mapping[str, Any]) -> str:
        if name.startswith("!"):
            return "${" + name[1:] + "}"  # ${!Literal} is the literal ${Literal}
        if name in variables:
            return _string(self.value(variables[name]))
        if "." in name and not name.startswith("AWS::"):
            resource, attribute = name.split(".", 1)
            return _string(self._get_att(resource, attribute))
        return _string(self._ref(name))

    def _list(self, items: Any) -> list[Any]:
        value = self.value(items)
        if isinstance(value, str):
            return value.split(",")  # a List<...> or CommaDelimitedList parameter
        if not isinstance(value, list):
            raise _Unresolvable(f"{_render(items)} is not a list")
        return value

    def _ref(self, name: str) -> Any:
        pseudo = {
            "AWS::Region": self.region,
            "AWS::AccountId": _LOCAL_ACCOUNT,
            "AWS::StackName": self.template.stack_name,
            "AWS::StackId": f"arn:aws:cloudformation:{self.region}:{_LOCAL_ACCOUNT}:stack/"
            f"{self.template.stack_name}/local",
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }
        if name == "AWS::NoValue":
            raise _NoValue
        if name in pseudo:
            return pseudo[name]
        if name in self.overrides:
            return self.overrides[name]
        parameters: Mapping[str, Any] = self.template.document.get("Parameters") or {}
        if name in parameters:
            if "Default" not in parameters[name]:
                raise _Unresolvable(
                    f"parameter {name} has no Default; pass --parameter {name}=VALUE"
                )
            return _string(parameters[name]["Default"])
        resource = self.template.resources.get(name)
        owner, _, generated = name.partition(".")
        if (
            resource is None
            and generated in ("Alias", "Version")
            and owner in self.template.resources
        ):
            # SAM's `!Ref <Function>.Alias` / `.Version`: what AutoPublishAlias publishes
            raise _Unresolvable(f"{name} (SAM's AutoPublishAlias) exists only when deployed")
        if resource is None:
            raise _Unresolvable(f"{name} is neither a parameter nor a resource of the template")
        if resource.get("Type") == _BUCKET_TYPE:
            return self._bucket(name, resource)
        raise _Unresolvable(f"{name} is a {resource.get('Type')}: it exists only when deployed")

    def _get_att(self, name: str, attribute: str) -> Any:
        resource = self.template.resources.get(name) or {}
        if resource.get("Type") == _BUCKET_TYPE and attribute == "Arn":
            return f"arn:aws:s3:::{self._bucket(name, resource)}"
        kind = resource.get("Type", "no resource")
        raise _Unresolvable(f"{name}.{attribute} ({kind}) exists only when deployed")

    def _bucket(self, name: str, resource: Mapping[str, Any]) -> str:
        if name not in self.buckets:
            given = (resource.get("Properties") or {}).get("BucketName")
            local = given if isinstance(given, str) else f"{self.template.stack_name}-{name}"
            # S3 bucket names: lowercase, digits, dots and hyphens, 3 to 63 characters.
            self.buckets[name] = re.sub(r"[^a-z0-9.-]", "-", _snake(local).replace("_", "-"))[:63]
        return self.buckets[name]

    def condition(self, node: Any) -> bool:
        if isinstance(node, str):
            conditions: Mapping[str, Any] = self.template.document.get("Conditions") or {}
            if node not in conditions:
                raise _Unresolvable(f"no condition {node}")
            return self.condition(conditions[node])
        if isinstance(node, dict) and len(node) == 1:
            ((key, arg),) = node.items()
            if key == "Fn::Equals":
                return _string(self.value(arg[0])) == _string(self.value(arg[1]))
            if key == "Fn::Not":
                return not self.condition(arg[0])
            if key == "Fn::And":
                return all(self.condition(item) for item in arg)
            if key == "Fn::Or":
                return any(self.condition(item) for item in arg)
            if key == "Condition":
                return self.condition(arg)
        raise _Unresolvable(f"cannot evaluate the condition {_render(node)}")


def _string(value: Any) -> str:
    """A value as an environment variable holds it (CloudFormation's strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def _render(node: Any) -> str:
    """An (unresolved) template value in its short form, for the report."""
    if isinstance(node, dict) and len(node) == 1:
        ((key, arg),) = node.items()
        short = key.removeprefix("Fn::")
        if key == "Fn::GetAtt" and isinstance(arg, list):
            return f"!GetAtt {'.'.join(map(str, arg))}"
        if isinstance(arg, str):
            return f"!{short} {arg}"
        return f"!{short} {json.dumps(arg, default=str)}"
    return node if isinstance(node, str) else json.dumps(node, default=str)


# -- the local environment ---------------------------------------------------------------------


@dataclass(frozen=True)
class LocalTarget:
    """What the embedded stack offers the functions, and where their state lives."""

    nats_url: str
    state_root: Path
    s3_endpoint_url: str | None = None
    nats_monitor_urls: str | None = None
    region: str = _LOCAL_REGION


@dataclass(frozen=True)
class EnvMapping:
    """One variable whose local value differs from the template's (or that was added or
    left unset), and why."""

    name: str
    template_value: str | None  # None: not in the template (added)
    local_value: str | None  # None: unset for the run
    reason: str

    def describe(self) -> str:
        before = self.template_value if self.template_value is not None else "(not set)"
        after = self.local_value if self.local_value is not None else "(unset)"
        return f"{self.name}: {before} -> {after}  ({self.reason})"


@dataclass(frozen=True)
class LocalEnvironment:
    """The function's variables for a local run, what was mapped, and the buckets to make."""

    variables: Mapping[str, str]
    mappings: tuple[EnvMapping, ...]
    buckets: tuple[str, ...]


def local_environment(
    template: Template,
    spec: FunctionSpec,
    target: LocalTarget,
    *,
    parameters: Mapping[str, str] | None = None,
    overrides: Mapping[str, str | None] | None = None,
) -> LocalEnvironment:
    """The function's environment resolved for ``target`` (the table in the module doc),
    then ``overrides`` (``--env-vars``, see :func:`read_env_vars`) set over it.

    Raises :class:`InvokeError` for a ``--parameter`` the template does not declare.
    """
    parameters = dict(parameters or {})
    declared = set(template.document.get("Parameters") or {})
    unknown = sorted(set(parameters) - declared)
    if unknown:
        raise InvokeError(
            f"unknown parameter(s) {', '.join(unknown)}; the template declares: "
            f"{', '.join(sorted(declared)) or 'none'}"
        )
    resolver = _Resolver(template, parameters, region=target.region)
    variables: dict[str, str] = {}
    mappings: list[EnvMapping] = []

    def mapped(name: str, raw: Any, local: str | None, reason: str) -> None:
        shown = None if raw is None else _render(raw)
        if local is not None:
            variables[name] = local
        if shown != local:
            mappings.append(EnvMapping(name, shown, local, reason))

    for name, raw in spec.environment.items():
        if name == _NATS_URL:
            mapped(name, raw, target.nats_url, "the local nats-server")
        elif name == _NATS_MONITOR_URLS:
            mapped(name, raw, target.nats_monitor_urls, "the local nats-server's monitoring")
        elif name in _LOCAL_SETTINGS:
            mapped(name, raw, *_LOCAL_SETTINGS[name])
        else:
            buckets_before = len(resolver.buckets)
            try:
                value = _string(resolver.value(raw))
            except _NoValue:
                mapped(name, raw, None, "!Ref AWS::NoValue drops it")
                continue
            except _Unresolvable as exc:
                mapped(name, raw, None, str(exc))
                continue
            if value == _MOUNT_PREFIX.rstrip("/") or value.startswith(_MOUNT_PREFIX):
                local = target.state_root / value.removeprefix("/mnt").lstrip("/")
                mapped(name, raw, str(local), "the mount's local folder under --root")
            else:
                bucket = len(resolver.buckets) > buckets_before
                mapped(name, raw, value, "a bucket on the local S3" if bucket else "resolved")
    if _NATS_URL not in variables:
        mapped(_NATS_URL, None, target.nats_url, "the local nats-server")
    if target.s3_endpoint_url and _S3_ENDPOINT_URL not in variables:
        mapped(_S3_ENDPOINT_URL, None, target.s3_endpoint_url, "the local S3 (moto)")
    for name, override in (overrides or {}).items():
        mappings[:] = [m for m in mappings if m.name != name]
        variables.pop(name, None)
        mapped(name, spec.environment.get(name), override, "given by --env-vars")
    variables.update(_lambda_variables(spec, target.region))
    return LocalEnvironment(variables, tuple(mappings), tuple(sorted(resolver.buckets.values())))


def _lambda_variables(spec: FunctionSpec, region: str) -> dict[str, str]:
    """The variables the Lambda runtime sets, as ``sam local invoke`` sets them."""
    return {
        # Powertools reads this as "under sam local": its tracer stays off (no X-Ray daemon).
        "AWS_SAM_LOCAL": "true",
        "AWS_LAMBDA_FUNCTION_NAME": spec.logical_id,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(spec.timeout_s),
        "AWS_LAMBDA_FUNCTION_HANDLER": spec.handler,
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.logical_id}",
        "AWS_REGION": os.environ.get("AWS_REGION", region),
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", region),
    }


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` as the function sees it, for the block; restored afterwards."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(_HIDDEN_PREFIXES):
            del os.environ[name]
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -- running the handler -----------------------------------------------------------------------


@dataclass
class LocalLambdaContext:
    """The Lambda context object: names, memory, and the time left before the Timeout."""

    function_name: str
    timeout_s: float
    memory_limit_in_mb: int = _DEFAULT_MEMORY_MB
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    monotonic: Callable[[], float] = time.monotonic
    started_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.monotonic()

    @property
    def invoked_function_arn(self) -> str:
        return _function_arn(self.function_name)

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        return f"local/[$LATEST]{self.aws_request_id.replace('-', '')}"

    def get_remaining_time_in_millis(self) -> int:
        elapsed = self.monotonic() - self.started_at
        return max(0, int((self.timeout_s - elapsed) * 1000))


def _function_arn(name: str) -> str:
    return f"arn:aws:lambda:{_LOCAL_REGION}:{_LOCAL_ACCOUNT}:function:{name}"


@dataclass(frozen=True)
class Invocation:
    """What one invocation returned (``result``) or raised (``error``, Lambda's shape:
    ``errorType``, ``errorMessage``, ``stackTrace``), how long it took, and the built layers
    it ran with (none: in this process, from the sources)."""

    spec: FunctionSpec
    environment: LocalEnvironment
    result: Any
    error: Mapping[str, Any] | None
    duration_s: float
    layers: tuple[Path, ...] = ()

    @property
    def timed_out(self) -> bool:
        """Lambda would have stopped it: it ran longer than the function's Timeout."""
        return self.duration_s > self.spec.timeout_s

    def response(self) -> Any:
        """What ``sam local invoke`` prints: the result, or the error object."""
        return self.error if self.error is not None else self.result


def run_handler(
    template: Template,
    spec: FunctionSpec,
    event: Any,
    environment: LocalEnvironment,
    *,
    monotonic: Callable[[], float] = time.monotonic,
) -> Invocation:
    """Call the function's handler with ``event``, in ``environment``, as a cold start.

    In this process when the function's layers bring no built content (the source
    template); otherwise in a child interpreter whose path starts with the function's
    folder and the layers' ``python/`` folders. A handler's exception becomes
    :attr:`Invocation.error`; it is not raised.
    """
    layers, _ = _usable_layers(template, spec)
    started = monotonic()
    if layers:
        result, error = _run_in_child(spec, layers, event, environment.variables)
    else:
        result, error = _run_in_process(spec, event, environment.variables, monotonic)
    return Invocation(spec, environment, result, error, monotonic() - started, tuple(layers))


def _run_in_process(
    spec: FunctionSpec,
    event: Any,
    variables: Mapping[str, str],
    monotonic: Callable[[], float],
) -> tuple[Any, Mapping[str, Any] | None]:
    # The roles share one runtime per process (built from the environment on first use):
    # forget any earlier one so this run is a cold start on this function's variables.
    from rhumbatron.runtime import process

    with _environment(variables):
        process.reset_for_tests()
        try:
            with _handler_module(spec) as module:
                handler = getattr(module, spec.attribute, None)
                if not callable(handler):
                    raise InvokeError(
                        f"{spec.logical_id}: {spec.code_dir / spec.module}.py has no "
                        f"{spec.attribute}() (Handler {spec.handler})"
                    )
                context = LocalLambdaContext(
                    spec.logical_id, spec.timeout_s, spec.memory_mb, monotonic=monotonic
                )
                result = handler(event, context)
                json.dumps(result)  # Lambda must serialise the response
                return result, None
        except InvokeError:
            raise
        except Exception as exc:
            return None, _lambda_error(exc)
        finally:
            # Drain NATS and close the files now, on this run's variables, before the caller
            # stops the local stack.
            process.reset_for_tests()


@contextlib.contextmanager
def _handler_module(spec: FunctionSpec) -> Iterator[Any]:
    """Import the handler module as Lambda does (its folder first on ``sys.path``), then
    forget it and whatever else it loaded from that folder: every function names its
    module ``app``."""
    source = spec.code_dir / (spec.module.replace(".", "/") + ".py")
    if not source.is_file():
        raise InvokeError(
            f"{spec.logical_id}: Handler {spec.handler} needs {source}, which does not exist"
        )
    top = spec.module.split(".", 1)[0]
    saved = {n: m for n, m in sys.modules.items() if n == top or n.startswith(top + ".")}
    for name in saved:
        del sys.modules[name]
    folder = str(spec.code_dir)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    try:
        yield importlib.import_module(spec.module)
    finally:
        sys.path.remove(folder)
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", "") or "").startswith(folder + os.sep):
                del sys.modules[name]
        sys.modules.update(saved)


def _lambda_error(exc: BaseException) -> dict[str, Any]:
    return {
        "errorType": type(exc).__name__,
        "errorMessage": str(exc),
        "stackTrace": traceback.format_exception(exc),
    }


def _usable_layers(template: Template, spec: FunctionSpec) -> tuple[list[Path], list[str]]:
    """The built layers' ``python/`` folders this interpreter can load, and a note on each
    layer left out because it holds compiled modules for another platform or Python."""
    usable, skipped = [], []
    own = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so
    for layer in spec.layers:
        python = template.layer_dir(layer)
        if python is None:
            continue
        foreign = next(
            (
                p
                for p in python.rglob("*.cpython-*")
                if p.suffix in (".so", ".pyd") and not p.name.endswith(own)
            ),
            None,
        )
        if foreign is None:
            usable.append(python)
        else:
            skipped.append(
                f"{layer}: built for another platform ({foreign.name}); its packages come "
                "from this interpreter"
            )
    return usable, skipped


# The child interpreter of a built function: only the standard library before the handler's
# own imports, so that `rhumbatron` comes from the code layer, as on Lambda.
_CHILD = r"""
import json, sys, time, traceback, uuid
spec = json.load(open(sys.argv[1]))
sys.path[:0] = spec["path"]

class Context:
    function_name = spec["function"]
    function_version = "$LATEST"
    memory_limit_in_mb = spec["memory_mb"]
    invoked_function_arn = spec["arn"]
    log_group_name = "/aws/lambda/" + spec["function"]
    aws_request_id = str(uuid.uuid4())
    log_stream_name = "local/[$LATEST]" + aws_request_id.replace("-", "")
    started = time.monotonic()
    def get_remaining_time_in_millis(self):
        return max(0, int((spec["timeout_s"] - (time.monotonic() - self.started)) * 1000))

try:
    module = __import__(spec["module"], fromlist=["_"])
    result = getattr(module, spec["attribute"])(spec["event"], Context())
    answer = {"result": result}
    json.dumps(answer)
except Exception as exc:
    answer = {"error": {"errorType": type(exc).__name__, "errorMessage": str(exc),
                        "stackTrace": traceback.format_exception(exc)}}
with open(spec["answer"], "w") as out:
    json.dump(answer, out)
"""


def _run_in_child(
    spec: FunctionSpec, layers: Sequence[Path], event: Any, variables: Mapping[str, str]
) -> tuple[Any, Mapping[str, Any] | None]:
    with tempfile.TemporaryDirectory(prefix="rhumbatron-invoke-") as scratch:
        spec_file, answer_file = Path(scratch) / "spec.json", Path(scratch) / "answer.json"
        spec_file.write_text(
            json.dumps(
                {
                    "path": [str(spec.code_dir), *map(str, layers)],
                    "module": spec.module,
                    "attribute": spec.attribute,
                    "event": event,
                    "function": spec.logical_id,
                    "memory_mb": spec.memory_mb,
                    "timeout_s": spec.timeout_s,
                    "arn": _function_arn(spec.logical_id),
                    "answer": str(answer_file),
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(_HIDDEN_PREFIXES)}
        env.update(variables)
        # The handler's logs (stdout and stderr) go to this process's stderr, as the function
        # logs do under `sam local invoke`; the answer comes back in a file.
        completed = subprocess.run(
            [sys.executable, "-c", _CHILD, str(spec_file)],
            env=env,
            stdout=sys.stderr,
            stderr=sys.stderr,
            check=False,
        )
        if not answer_file.is_file():
            return None, {
                "errorType": "Runtime.ExitError",
                "errorMessage": f"the handler's interpreter exited with {completed.returncode} "
                "before answering",
            }
        answer = json.loads(answer_file.read_text())
    return answer.get("result"), answer.get("error")


# -- the local stack and the whole invocation --------------------------------------------------


@contextlib.contextmanager
def local_target(
    root: Path = DEFAULT_ROOT,
    *,
    nats_url: str | None = None,
    s3_endpoint_url: str | None = None,
) -> Iterator[LocalTarget]:
    """The embedded stack for invocations: a nats-server (store under ``root/nats``) unless
    ``nats_url`` is given, and moto's S3 unless ``s3_endpoint_url`` is; stopped on exit.
    The functions' ``/mnt/<name>`` folders live under ``root``."""
    from rhumbatron_dev.local.nats_server import NatsServerProcess
    from rhumbatron_dev.local.s3_server import S3ServerProcess

    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    nats = None if nats_url else NatsServerProcess(store_dir=root / "nats")
    s3 = None if s3_endpoint_url else S3ServerProcess()
    try:
        if nats is not None:
            nats.start()
        if s3 is not None:
            s3.start()
        yield LocalTarget(
            nats_url=nats_url or (nats.url if nats else ""),
            nats_monitor_urls=f"http://127.0.0.1:{nats.http_port}" if nats else None,
            s3_endpoint_url=s3_endpoint_url or (s3.endpoint_url if s3 else None),
            state_root=root,
        )
    finally:
        try:
            if s3 is not None:
                s3.stop()
        finally:
            if nats is not None:
                nats.stop()


def _create_buckets(target: LocalTarget, buckets: Sequence[str]) -> None:
    """Make the function's buckets on the local S3 (moto keeps none across restarts)."""
    if not buckets:
        return
    if not target.s3_endpoint_url:
        raise InvokeError(f"the function uses the bucket(s) {', '.join(buckets)} but no S3")
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client(
        "s3",
        endpoint_url=target.s3_endpoint_url,
        region_name=target.region,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    for bucket in buckets:
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise LocalStackError(
                    f"cannot create the bucket {bucket} on {target.s3_endpoint_url}: {exc}"
                ) from exc
        except BotoCoreError as exc:
            raise LocalStackError(
                f"cannot reach the S3 endpoint {target.s3_endpoint_url}: {exc}"
            ) from exc


def read_env_vars(path: Path, logical_id: str, declared: Iterable[str]) -> dict[str, str | None]:
    """The overrides for ``logical_id`` in a ``sam local invoke --env-vars`` file: JSON whose
    ``"Parameters"`` object applies to every function (only to the variables a function
    declares, as SAM does) and whose ``"<LogicalId>"`` object applies to that function.

    Unlike SAM, the function's own object may add variables the template does not declare
    (a local secret, say), and ``null`` unsets a variable (an empty string is a value).
    Raises :class:`InvokeError` for an unreadable file or a value that is not a string,
    number, boolean or null.
    """
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvokeError(f"cannot read the --env-vars file {path}: {exc}") from exc
    if not isinstance(document, dict):
        raise InvokeError(f"the --env-vars file {path} must hold a JSON object")
    declared = set(declared)
    every = document.get("Parameters") or {}
    overrides = {name: value for name, value in every.items() if name in declared}
    overrides.update(document.get(logical_id) or {})
    for name, value in overrides.items():
        if isinstance(value, dict | list):
            raise InvokeError(f"{path}: {logical_id} {name}={value!r} is not a string")
    return {name: None if v is None else _string(v) for name, v in overrides.items()}


def read_event(path: Path, template: Template | None = None, logical_id: str = "") -> Any:
    """The event file's JSON; :class:`InvokeError` names the file and, given the template
    and the function, that function's samples in ``events/`` beside the template."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        samples = ""
        if template is not None and logical_id:
            events_dir = template.directory / "events"
            names = [str(p) for p in sample_events(template, logical_id, events_dir)]
            samples = f"; samples for {logical_id}: {', '.join(names) or 'none'}"
        raise InvokeError(f"cannot read the event {path}: {exc.strerror}{samples}") from exc
    except json.JSONDecodeError as exc:
        raise InvokeError(f"the event {path} is not JSON: {exc}") from exc


def invoke(
    logical_id: str,
    event: Any,
    target: LocalTarget,
    *,
    template: Template | None = None,
    parameters: Mapping[str, str] | None = None,
    overrides: Mapping[str, str | None] | None = None,
) -> Invocation:
    """Invoke the function ``logical_id`` of ``template`` (``./template.yaml`` by default)
    with ``event`` against ``target``: resolve, make its buckets, run."""
    template = template or load_template()
    spec = template.function(logical_id)
    environment = local_environment(
        template, spec, target, parameters=parameters, overrides=overrides
    )
    _create_buckets(target, environment.buckets)
    return run_handler(template, spec, event, environment)


# -- the command -------------------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    """``rhumbatron invoke``: 0 done, 1 the handler failed or overran its Timeout (or the
    stack did not start), 2 an unknown function, parameter or event file."""

    def say(line: str) -> None:
        print(f"rhumbatron invoke: {line}", file=sys.stderr)

    try:
        parameters = dict(_parameter(p) for p in args.parameter or [])
        template = load_template(args.template)
        spec = template.function(args.function)
        event = read_event(Path(args.event), template, spec.logical_id)
        overrides = (
            read_env_vars(Path(args.env_vars), spec.logical_id, spec.environment)
            if args.env_vars
            else {}
        )
        with local_target(
            Path(args.root), nats_url=args.nats_url, s3_endpoint_url=args.s3_endpoint_url
        ) as target:
            environment = local_environment(
                template, spec, target, parameters=parameters, overrides=overrides
            )
            say(
                f"{spec.logical_id}: {spec.handler} from {spec.code_dir}, Timeout "
                f"{spec.timeout_s} s, {spec.memory_mb} MB; NATS {target.nats_url}, S3 "
                f"{target.s3_endpoint_url}"
            )
            for mapping in environment.mappings:
                say(f"mapped {mapping.describe()}")
            usable, skipped = _usable_layers(template, spec)
            for note in [f"{path}: built, first on the path" for path in usable] + skipped:
                say(f"layer {note}")
            _create_buckets(target, environment.buckets)
            # The handler's own prints and logs go to stderr: stdout carries only the answer.
            with contextlib.redirect_stdout(sys.stderr):
                invocation = run_handler(template, spec, event, environment)
            print(json.dumps(invocation.response(), indent=2, default=str))
            status = 0
            if invocation.error is not None:
                say(f"{spec.logical_id} failed: {invocation.error['errorType']}")
                status = 1
            if invocation.timed_out:
                say(
                    f"{spec.logical_id} ran {invocation.duration_s:.1f} s, longer than its "
                    f"Timeout of {spec.timeout_s} s: Lambda would have stopped it"
                )
                status = 1
            say(f"{spec.logical_id} took {invocation.duration_s:.2f} s")
            if args.keep_stack:
                _wait_for_interrupt(target, say)
            return status
    except InvokeError as exc:
        say(str(exc))
        return 2
    except RhumbatronError as exc:
        say(str(exc))
        return 1


def _parameter(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise InvokeError(f"--parameter {text!r} is not NAME=VALUE")
    return name, value


#: What ends ``--keep-stack``: Ctrl-C, and the SIGTERM a script or a process manager sends
#: (left to its default, SIGTERM would kill the command and orphan its nats-server).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _wait_for_interrupt(target: LocalTarget, say: Callable[[str], None]) -> None:
    """Block until SIGINT or SIGTERM, then return so that the caller stops the stack.

    Not ``threading.Event().wait()`` under ``KeyboardInterrupt``: the kernel gives a signal
    sent to the process to any of its threads, and when moto's server thread takes it the
    main thread's lock wait is not interrupted, so Python never runs the handler and the
    command waits forever with the stack up. Python writes every handled signal's number to
    the wakeup fd from whichever thread took it, so a read of that fd wakes the main thread
    every time. The handlers are set here rather than relied upon: a process a shell starts
    in the background inherits SIGINT ignored, and Python then installs none.
    """
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    stops = {int(sig) for sig in _STOP_SIGNALS}
    reader, writer = socket.socketpair()
    with reader, writer:
        writer.setblocking(False)  # the C-level handler writes to it: it must never block
        old_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        try:
            for sig in _STOP_SIGNALS:
                signal.signal(sig, _signal_is_on_the_wakeup_fd)
            # Ready for the signal before saying so: a script may send it once it reads this.
            say(
                f"the stack keeps running until Ctrl-C; invoke again against it with "
                f"--nats-url {target.nats_url} --s3-endpoint-url {target.s3_endpoint_url}"
            )
            sys.stderr.flush()
            received: set[int] = set()
            while not received & stops:
                received = set(reader.recv(64))
            say(f"{signal.Signals(min(received & stops)).name}: stopping the stack")
        finally:
            for sig, handler in previous.items():
                # None: a handler set outside Python, which cannot be put back; the default is.
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
            signal.set_wakeup_fd(old_wakeup_fd)


def _signal_is_on_the_wakeup_fd(signum: int, frame: object) -> None:
    """Nothing to do: that Python has a handler for ``signum`` is what makes it write the
    signal to the wakeup fd, which :func:`_wait_for_interrupt` reads."""
