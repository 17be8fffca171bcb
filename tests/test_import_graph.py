"""The package's import graph keeps its shape: floors from the leaves up, no import from a lower floor to a higher
one, no circle. Read from the source (every import, a function's own included), nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "stagedyolo"

# Lowest first. A module may import its own floor or lower ones. Each name is a module or a subpackage of stagedyolo.
FLOORS = [
    # what knows nothing else of stagedyolo: yolov5's constants, files, processes, the machine
    {"", "checkout", "yolov5_facts", "jsonio", "ownership", "fixed_costs", "envcheck", "launch"},
    # measuring and reading: the timer, the sampler, progress, the dataset tools
    {"telemetry", "progress", "status", "dataset"},
    # yolov5 itself: the engine adapter
    {"engine"},
    # the recipe and what reasons about a stage: its budget, its shape, its plan, the probe, the diagnosis, final jobs
    {"recipe", "recipe_budget", "recipe_shape", "stage_plan", "probe", "diagnosis", "evaluate", "export"},
    # running workers and reading their results
    {"worker_launch", "tune", "report"},
    # the jobs and faces: a stage, tracking, the demo, the config check, the command line
    {"stage", "tracking", "demo", "config", "cli"},
]


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the stagedyolo modules it imports, anywhere in it}, names relative to the package."""
    paths = {module_name(path, package): path for path in package.rglob("*.py")}
    return {name: imports(path, set(paths)) - {name} for name, path in paths.items()}


def imports(path: Path, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("stagedyolo"):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("stagedyolo")]
        else:
            continue
        found |= {_known_prefix(name.removeprefix("stagedyolo").lstrip("."), known) for name in names}
    return found


def _known_prefix(name: str, known: set[str]) -> str:
    while name not in known:
        name = name.rpartition(".")[0]
    return name


def floor(module: str) -> int:
    top = module.split(".")[0]
    for index, names in enumerate(FLOORS):
        if top in names:
            return index
    raise AssertionError(f"stagedyolo.{module} is on no floor: add it to FLOORS in {Path(__file__).name}")


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"stagedyolo.{source} (floor {floor(source)}) imports stagedyolo.{target} (floor {floor(target)})"
        for source, targets in edges.items()
        for target in targets
        if floor(target) > floor(source)
    )


def circles(edges: dict[str, set[str]]) -> list[str]:
    state, found = {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                found.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_has_a_floor():
    for name in graph():
        floor(name)


def test_no_import_climbs_to_a_higher_floor():
    upward = upward_imports(graph())
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    found = circles(graph())
    assert not found, "\n".join(found)


def test_the_checks_find_a_planted_circle_and_upward_import(tmp_path):
    planted = tmp_path / "stagedyolo"
    (planted / "engine").mkdir(parents=True)
    for path, text in {
        "__init__.py": "",
        "engine/__init__.py": "",
        "jsonio.py": "from stagedyolo.engine.a import x\n",
        "engine/a.py": "def f():\n    from stagedyolo.engine import b\n",
        "engine/b.py": "import stagedyolo.engine.a\n",
    }.items():
        (planted / path).write_text(text)
    edges = graph(planted)
    assert upward_imports(edges) == ["stagedyolo.jsonio (floor 0) imports stagedyolo.engine.a (floor 2)"]
    assert circles(edges) == ["engine.a -> engine.b -> engine.a"]
