"""The package's public API: the curated ``rhumbatron.__all__``, resolved on first use.

``import rhumbatron`` is on every Lambda handler's import path, so the package imports its
exports lazily (PEP 562 ``__getattr__``); type checkers read the same names from imports under
``TYPE_CHECKING``. These tests keep the three in step — ``__all__``, what the attributes
resolve to, and what the type checker is told — and pin the cold start: a fresh interpreter
that imports the package (and even resolves an error class) loads none of the heavy modules.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rhumbatron
from rhumbatron import errors

SHARED = Path(__file__).resolve().parents[2] / "shared"
INIT = SHARED / "rhumbatron" / "__init__.py"

#: What ``import rhumbatron`` must not load: the composition root, the message registry, the
#: settings model and the libraries behind them, the NATS client, the HTTP and AWS clients.
HEAVY = (
    "rhumbatron.runtime",
    "rhumbatron.protocol.envelopes",
    "rhumbatron.protocol.event_types",
    "rhumbatron.protocol.command_types",
    "rhumbatron.core.settings",
    "pydantic",
    "pydantic_settings",
    "nats",
    "httpx",
    "boto3",
)

#: The child: import the package, report what is loaded and what ``dir`` lists; then resolve
#: the base error (a handler's ``except rhumbatron.RhumbatronError``) and report again.
_CHILD = """
import json, sys
import rhumbatron
report = {"file": rhumbatron.__file__, "dir": dir(rhumbatron), "modules": sorted(sys.modules)}
rhumbatron.RhumbatronError
report["modules_after_error"] = sorted(sys.modules)
print(json.dumps(report))
"""

PUBLIC = [name for name in rhumbatron.__all__ if name != "__version__"]


def _loaded(modules: list[str]) -> list[str]:
    return [
        heavy for heavy in HEAVY if any(m == heavy or m.startswith(heavy + ".") for m in modules)
    ]


def _type_checking_imports() -> dict[str, str]:
    """Each name imported under ``if TYPE_CHECKING:`` in ``__init__.py``, with its module."""
    tree = ast.parse(INIT.read_text(), str(INIT))
    imported: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                assert statement.module is not None
                for alias in statement.names:
                    imported[alias.asname or alias.name] = statement.module
    return imported


@pytest.fixture(scope="module")
def fresh() -> dict[str, list[str] | str]:
    """What a fresh interpreter reports after ``import rhumbatron`` (this checkout's package)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RHUMBATRON_", "PYTHON"))}
    env["PYTHONPATH"] = str(SHARED)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, list[str] | str] = json.loads(done.stdout)
    assert Path(str(report["file"])).resolve() == INIT.resolve()
    return report


@pytest.mark.parametrize("name", PUBLIC)
def test_every_exported_name_is_the_object_of_its_defining_module(name: str) -> None:
    # GIVEN a name of __all__
    # WHEN it is read from the package
    value = getattr(rhumbatron, name)

    # THEN it is the very object its defining module holds, and the module is the one the
    # type checker is told about
    defining = value.__module__
    assert defining.startswith("rhumbatron."), defining
    assert getattr(importlib.import_module(defining), name) is value
    assert _type_checking_imports()[name] == defining


def test_the_type_checker_is_told_exactly_the_names_of_all() -> None:
    # GIVEN the imports under TYPE_CHECKING
    # THEN they are the names of __all__ (bar the version, defined in place), each once
    assert sorted(_type_checking_imports()) == sorted(PUBLIC)


def test_the_errors_exported_are_the_base_and_every_family_of_the_tree() -> None:
    # GIVEN the error tree of rhumbatron.errors
    families = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and errors.RhumbatronError in value.__bases__
    }
    # WHEN the exported errors are listed
    exported = {
        name
        for name in PUBLIC
        if inspect.isclass(value := getattr(rhumbatron, name)) and issubclass(value, BaseException)
    }
    # THEN they are the base and each of its direct subclasses, all from rhumbatron.errors
    assert exported == {"RhumbatronError", *families}
    assert all(getattr(rhumbatron, name) is getattr(errors, name) for name in exported)


def test_all_is_sorted_without_duplicates_and_holds_the_version() -> None:
    names = rhumbatron.__all__
    assert names == sorted(names)
    assert len(names) == len(set(names))
    assert {"__version__", "bootstrap", "Rhumbatron", "Settings", "load_settings"} <= set(names)
    assert {"Event", "Command", "RhumbatronError"} <= set(names)
    assert isinstance(rhumbatron.__version__, str)


def test_dir_lists_every_name_of_all_before_any_is_resolved(
    fresh: dict[str, list[str] | str],
) -> None:
    # GIVEN a fresh interpreter that only imported the package
    # THEN dir() lists the whole public API (and the module's own attributes)
    listed = set(fresh["dir"])
    assert set(rhumbatron.__all__) <= listed
    assert {"__name__", "__file__", "__path__"} <= listed
    assert set(rhumbatron.__all__) <= set(dir(rhumbatron))


def test_an_unknown_attribute_raises_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match=r"module 'rhumbatron' has no attribute 'Nothing'"):
        _ = rhumbatron.Nothing
    assert not hasattr(rhumbatron, "no_such_name")


def test_a_submodule_still_imports_by_name_from_the_package() -> None:
    # `from rhumbatron import operator` falls back to the submodule when the attribute is not
    # an export: the lazy __getattr__ must refuse it with AttributeError, not another error
    from rhumbatron import operator

    assert operator.__name__ == "rhumbatron.operator"


def test_importing_the_package_in_a_fresh_interpreter_loads_no_heavy_module(
    fresh: dict[str, list[str] | str],
) -> None:
    # GIVEN a fresh interpreter, as a Lambda cold start
    # WHEN it imports the package, then resolves the base error
    # THEN none of the heavy modules is loaded, before or after (errors.py is standard library)
    assert _loaded(list(fresh["modules"])) == [], (
        "importing rhumbatron loads these: import them lazily (see rhumbatron/__init__.py)"
    )
    assert _loaded(list(fresh["modules_after_error"])) == []
    assert "rhumbatron.errors" in fresh["modules_after_error"]
