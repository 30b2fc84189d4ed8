"""(h) Cold starts: the import time of each Lambda function's handler module.

Lambda bills and the caller waits for a cold container's init, and most of a Python
function's init is importing its handler module. For every ``AWS::Serverless::Function`` of
``template.yaml`` (read by :func:`rhumbatron_dev.local.invoke.load_template`), a fresh interpreter
is started in the function's code folder (Lambda's ``/var/task``) with the environment the
function gets locally (:func:`~rhumbatron_dev.local.invoke.local_environment`, as ``rhumbatron
invoke`` resolves it; the NATS URL is a placeholder nothing listens on: importing must not
touch the network), and it times ``importlib.import_module("app")`` with
``time.perf_counter``. The first run per function writes the bytecode cache (``__pycache__``)
and is not counted; then ``--repeats`` measured runs, the functions' order rotating each
repeat. A function's figure is the median of its runs, and its limit is checked against it:
300 ms for every queue, publisher, nudge, sweep and workflow function, 700 ms for the API
(FastAPI is its job). Beside it: the max, the child's CPU time for the import (other
sessions' load on the machine stretches the wall clock, hardly this; the load average before
and after is printed too), the whole child process and the number of modules imported.

One more run per function under ``python -X importtime`` names where the time goes: the
modules imported by the handler, their self time summed per package (``rhumbatron.<sub>``
for the package's own modules), the heaviest five. ``-X importtime`` slows every import, so
these are shares, not the figure.

Reference points in the same run, measured the same way: a bare interpreter
(``python -c pass``, the whole process, start to exit, against each function's whole
process), and ``import boto3`` and ``import pydantic`` alone.

Run ``.venv/bin/python -m bench.cold_start`` (``--help`` for the knobs); ``make bench`` runs
it first, before the servers of the other benchmarks start.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import Figure
from rhumbatron_dev.local.invoke import (
    FunctionSpec,
    LocalTarget,
    Template,
    load_template,
    local_environment,
)

__all__ = [
    "API_LIMIT_MS",
    "FUNCTION_LIMIT_MS",
    "ColdStartOptions",
    "ColdStartSuite",
    "FunctionColdStart",
    "Reference",
    "cold_start_suite",
    "format_cold_starts",
    "heaviest_imports",
    "limit_ms",
    "main",
    "package_of",
]

#: The issue's limits on this machine, in ms of import time: the API imports FastAPI.
API_LIMIT_MS = 700.0
FUNCTION_LIMIT_MS = 300.0

#: The project's SAM template: the functions to measure.
TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "template.yaml"

#: The modules the references import alone.
REFERENCE_MODULES = ("boto3", "pydantic")

# Placeholders for the local environment: nothing listens there, and importing a handler
# must not connect anywhere.
_NATS_URL = "nats://127.0.0.1:1"
# A Lambda sees only its configuration: the calling shell's settings and Python's own
# variables (PYTHONDONTWRITEBYTECODE, PYTHONPATH …) would change what is measured.
_HIDDEN_PREFIXES = ("RHUMBATRON_", "POWERTOOLS_", "PYTHON")
_MARK = "--rhumbatron-cold-start--"

# The child: import one module, print how long it took (wall clock and CPU) and how many
# modules it loaded.
# Everything it uses before the clock starts (sys, time, importlib) is loaded at start-up.
_CHILD = f"""
import importlib, sys, time
sys.stderr.write({_MARK!r} + "\\n")
sys.stderr.flush()
before = len(sys.modules)
cpu = time.process_time()
started = time.perf_counter()
importlib.import_module(sys.argv[1])
elapsed = time.perf_counter() - started
cpu = time.process_time() - cpu
print(elapsed * 1000, cpu * 1000, len(sys.modules) - before)
"""


@dataclass(frozen=True, slots=True)
class ColdStartOptions:
    """The run's knobs."""

    repeats: int = 5
    template: Path = TEMPLATE_PATH
    top: int = 5


@dataclass(frozen=True, slots=True)
class _Sample:
    import_ms: float
    cpu_ms: float
    process_ms: float
    modules: int


@dataclass(frozen=True, slots=True)
class FunctionColdStart:
    """One function's measured runs, its limit and where its import time goes."""

    logical_id: str
    handler: str
    limit_ms: float
    import_ms: tuple[float, ...]
    #: The child's CPU time during the import: what a busy machine's wall clock hides.
    cpu_ms: tuple[float, ...]
    process_ms: tuple[float, ...]
    modules: int
    #: The heaviest packages under ``-X importtime``: (package, self ms summed).
    heaviest: tuple[tuple[str, float], ...]

    @property
    def median_ms(self) -> float:
        """The figure: the median import time of the measured runs."""
        return float(statistics.median(self.import_ms))

    @property
    def max_ms(self) -> float:
        """The slowest measured run."""
        return max(self.import_ms)

    @property
    def status(self) -> str:
        """``PASS`` when the median is at or under the limit, else ``MISS``."""
        return "PASS" if self.median_ms <= self.limit_ms else "MISS"

    def as_json(self) -> dict[str, Any]:
        """The function's result as ``results.json`` takes it."""
        return {
            "function": self.logical_id,
            "handler": self.handler,
            "median_ms": round(self.median_ms, 1),
            "max_ms": round(self.max_ms, 1),
            "limit_ms": self.limit_ms,
            "status": self.status,
            "samples_ms": [round(s, 1) for s in self.import_ms],
            "cpu_median_ms": round(statistics.median(self.cpu_ms), 1),
            "process_median_ms": round(statistics.median(self.process_ms), 1),
            "modules_imported": self.modules,
            "heaviest_imports_self_ms": [
                {"package": name, "self_ms": round(ms, 1)} for name, ms in self.heaviest
            ],
        }


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference point: a bare interpreter's whole process, or one module imported alone."""

    name: str
    #: The figure's name in ``results.json`` (``cold_start.reference.<key>``).
    key: str
    #: ``process``: the whole child process, start to exit; ``import``: the import alone.
    measures: str
    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        """The median of the samples."""
        return float(statistics.median(self.samples_ms))

    def as_json(self) -> dict[str, Any]:
        """The reference as ``results.json`` takes it."""
        return {
            "name": self.name,
            "figure": f"cold_start.reference.{self.key}",
            "measures": self.measures,
            "median_ms": round(self.median_ms, 1),
            "max_ms": round(max(self.samples_ms), 1),
            "samples_ms": [round(s, 1) for s in self.samples_ms],
        }


@dataclass(frozen=True, slots=True)
class ColdStartSuite:
    """What the cold-start benchmark produced."""

    functions: tuple[FunctionColdStart, ...]
    references: tuple[Reference, ...]
    repeats: int
    python: str
    #: ``os.getloadavg()`` before and after: a busy machine slows every child alike.
    load_before: tuple[float, ...]
    load_after: tuple[float, ...]

    @property
    def figures(self) -> list[Figure]:
        """Each function's import time as a figure (named ``cold_start.<LogicalId>``)."""
        return [
            Figure(
                f"cold_start.{f.logical_id}",
                "ms",
                f"import of {f.handler} in a fresh interpreter, bytecode cached "
                f"(limit {f.limit_ms:g} ms)",
                f.import_ms,
            )
            for f in self.functions
        ]

    @property
    def diagnostics(self) -> list[Figure]:
        """The references, and each function's whole process (start, import, exit)."""
        return [
            *(
                Figure(
                    f"cold_start.reference.{r.key}",
                    "ms",
                    f"reference: {r.name} ({r.measures})",
                    r.samples_ms,
                )
                for r in self.references
            ),
            *(
                Figure(
                    f"cold_start.{f.logical_id}.process",
                    "ms",
                    f"the whole child process importing {f.handler}: start, import, exit",
                    f.process_ms,
                )
                for f in self.functions
            ),
        ]

    def as_json(self) -> dict[str, Any]:
        """The suite as ``results.json`` takes it."""
        return {
            "statistic": f"median of {self.repeats} runs, bytecode cached (one warm-up run)",
            "python": self.python,
            "loadavg_before": [round(x, 2) for x in self.load_before],
            "loadavg_after": [round(x, 2) for x in self.load_after],
            "functions": [f.as_json() for f in self.functions],
            "references": [r.as_json() for r in self.references],
        }


# -- running the children ----------------------------------------------------------------------


def limit_ms(spec: FunctionSpec) -> float:
    """The function's limit: :data:`API_LIMIT_MS` for the API's folder, else the 300 ms."""
    return API_LIMIT_MS if spec.code_dir.name == "api" else FUNCTION_LIMIT_MS


def _child_environment(variables: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_HIDDEN_PREFIXES)}
    env.update(variables)
    return env


def _run_child(
    module: str, cwd: Path, env: Mapping[str, str], *, importtime: bool = False
) -> tuple[_Sample, str]:
    """Import ``module`` in a fresh interpreter; the sample and the child's stderr."""
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", _CHILD]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, module], cwd=cwd, env=dict(env), capture_output=True, text=True, check=False
    )
    process_ms = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(
            f"importing {module!r} in {cwd} failed (exit {done.returncode}); its stderr:\n"
            f"{done.stderr[-3000:]}\nfix the import before measuring it"
        )
    import_ms, cpu_ms, modules = done.stdout.split()
    return _Sample(float(import_ms), float(cpu_ms), process_ms, int(modules)), done.stderr


def _check_cached(spec: FunctionSpec) -> None:
    """The handler module's bytecode is cached after the warm-up run: the figures are for
    cached bytecode, without compiling (Lambda's ``/var/task`` is read-only, so a package
    that ships no ``.pyc`` files compiles on every cold start)."""
    source = spec.code_dir / f"{spec.module.replace('.', '/')}.py"
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.is_file():
        raise RuntimeError(
            f"{spec.logical_id}: no bytecode cache {cached} after the warm-up run; make "
            f"{cached.parent} writable and unset PYTHONDONTWRITEBYTECODE"
        )


def _bare_process_ms(cwd: Path, env: Mapping[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], cwd=cwd, env=dict(env), check=True)
    return (time.perf_counter() - started) * 1000


def package_of(module: str) -> str:
    """The package a module's import time is summed under: ``rhumbatron.<sub>`` for our own
    modules, the top-level name for everything else."""
    parts = module.split(".")
    if parts[0] == "rhumbatron" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def heaviest_imports(importtime: str, top: int = 5) -> tuple[tuple[str, float], ...]:
    """The ``top`` packages by self time (ms) in ``-X importtime`` output, counting only the
    modules imported after the child's start-up (after its marker line)."""
    _, _, after = importtime.partition(_MARK)
    by_package: dict[str, float] = defaultdict(float)
    for line in after.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = line.removeprefix("import time:").split("|")
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header line
        by_package[package_of(fields[2].strip())] += int(fields[0]) / 1000
    ranked = sorted(by_package.items(), key=lambda item: item[1], reverse=True)
    return tuple(ranked[:top])


@dataclass(frozen=True, slots=True)
class _Target:
    """One thing to import: a function's handler in its folder, or a reference module."""

    name: str
    module: str
    cwd: Path
    env: Mapping[str, str]


def _function_targets(
    template: Template, state_root: Path
) -> dict[str, tuple[FunctionSpec, _Target]]:
    target = LocalTarget(nats_url=_NATS_URL, state_root=state_root)
    found: dict[str, tuple[FunctionSpec, _Target]] = {}
    for logical_id in template.function_ids():
        spec = template.function(logical_id)
        variables = local_environment(template, spec, target).variables
        found[logical_id] = (
            spec,
            _Target(logical_id, spec.module, spec.code_dir, _child_environment(variables)),
        )
    return found


def _rotated(items: Sequence[str], by: int) -> list[str]:
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def cold_start_suite(
    options: ColdStartOptions, root: Path, log: Callable[[str], None] = lambda _: None
) -> ColdStartSuite:
    """Measure every function of ``options.template`` and the references; ``root`` is a
    scratch folder (the functions' local state root, the references' working folder)."""
    load_before = os.getloadavg()
    template = load_template(options.template)
    functions = _function_targets(template, root / "state")
    scratch = root / "reference"
    scratch.mkdir(parents=True, exist_ok=True)
    bare_env = _child_environment({})
    references = {
        f"import {name}": _Target(f"import {name}", name, scratch, bare_env)
        for name in REFERENCE_MODULES
    }
    targets = {**{k: t for k, (_, t) in functions.items()}, **references}

    log(f"cold starts: warming the bytecode cache of {len(functions)} functions")
    heaviest: dict[str, tuple[tuple[str, float], ...]] = {}
    modules: dict[str, int] = {}
    for name, target in targets.items():
        _run_child(target.module, target.cwd, target.env)  # writes __pycache__
        if name in functions:
            _check_cached(functions[name][0])
            _, stderr = _run_child(target.module, target.cwd, target.env, importtime=True)
            heaviest[name] = heaviest_imports(stderr, options.top)
    _bare_process_ms(scratch, bare_env)

    samples: dict[str, list[_Sample]] = {name: [] for name in targets}
    bare: list[float] = []
    kinds = [*targets, "python -c pass"]
    for rep in range(options.repeats):
        for name in _rotated(kinds, rep):
            if name == "python -c pass":
                bare.append(_bare_process_ms(scratch, bare_env))
                continue
            target = targets[name]
            sample, _ = _run_child(target.module, target.cwd, target.env)
            samples[name].append(sample)
            modules[name] = sample.modules
        log(f"cold starts: repeat {rep + 1} of {options.repeats} done")

    results = tuple(
        FunctionColdStart(
            logical_id=name,
            handler=f"{spec.code_dir.relative_to(template.directory)}/{spec.module}.py",
            limit_ms=limit_ms(spec),
            import_ms=tuple(s.import_ms for s in samples[name]),
            cpu_ms=tuple(s.cpu_ms for s in samples[name]),
            process_ms=tuple(s.process_ms for s in samples[name]),
            modules=modules[name],
            heaviest=heaviest[name],
        )
        for name, (spec, _) in functions.items()
    )
    refs = (
        Reference("python -c pass", "bare_interpreter", "process", tuple(bare)),
        *(
            Reference(
                name,
                name.removeprefix("import "),
                "import",
                tuple(s.import_ms for s in samples[name]),
            )
            for name in references
        ),
    )
    return ColdStartSuite(
        results, refs, options.repeats, sys.version.split()[0], load_before, os.getloadavg()
    )


# -- the table ---------------------------------------------------------------------------------


def format_cold_starts(suite: ColdStartSuite) -> str:
    """The functions' table (median, max, limit, status, the heaviest imports), then the
    references."""
    width = max(len("function"), *(len(f.logical_id) for f in suite.functions))
    head = (
        f"{'function':<{width}}  {'median ms':>9}  {'max ms':>7}  {'limit':>5}  {'status':<6}  "
        f"{'cpu ms':>6}  {'process':>7}  {'modules':>7}  "
        "heaviest imports (self ms under -X importtime)"
    )
    lines = [
        f"cold start: import of each handler module in a fresh interpreter, bytecode cached, "
        f"median of {suite.repeats} (python {suite.python}; load average before/after "
        f"{' '.join(f'{x:.2f}' for x in suite.load_before)} / "
        f"{' '.join(f'{x:.2f}' for x in suite.load_after)})",
        head,
        "-" * (len(head) + 40),
    ]
    for f in suite.functions:
        heavy = ", ".join(f"{name} {ms:.0f}" for name, ms in f.heaviest)
        lines.append(
            f"{f.logical_id:<{width}}  {f.median_ms:>9.1f}  {f.max_ms:>7.1f}  "
            f"{f.limit_ms:>5.0f}  {f.status:<6}  {statistics.median(f.cpu_ms):>6.1f}  "
            f"{statistics.median(f.process_ms):>7.1f}  "
            f"{f.modules:>7}  {heavy}"
        )
    lines.append("")
    lines.append(f"{'reference':<{width}}  {'median ms':>9}  {'max ms':>7}  measures")
    for r in suite.references:
        what = (
            "the whole process, start to exit (compare each function's process column)"
            if r.measures == "process"
            else "the import alone, as the functions' figure"
        )
        lines.append(f"{r.name:<{width}}  {r.median_ms:>9.1f}  {max(r.samples_ms):>7.1f}  {what}")
    return "\n".join(lines)


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, measure, print the table (and the JSON with ``--json``).

    A printed figure, not a test: a MISS is reported, the exit status stays 0.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.cold_start", description=__doc__)
    defaults = ColdStartOptions()
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="measured runs")
    parser.add_argument("--template", type=Path, default=defaults.template)
    parser.add_argument("--top", type=int, default=defaults.top, help="heaviest packages shown")
    parser.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = parser.parse_args(argv)
    options = ColdStartOptions(repeats=args.repeats, template=args.template, top=args.top)
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-") as temp:
        suite = cold_start_suite(options, Path(temp), _log)
    print(format_cold_starts(suite))
    if args.json:
        print(json.dumps(suite.as_json(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
