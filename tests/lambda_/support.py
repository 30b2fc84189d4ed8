"""What the Lambda-role tests share: a context object like Lambda's, the sample events, and
loading a function's ``app.py`` the way the Lambda runtime does (by file, not by package)."""

from __future__ import annotations

import importlib.util
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

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
