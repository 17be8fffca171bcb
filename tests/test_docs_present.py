"""The docs describe the present: no reference a reader cannot open, and no statement the code has left behind.

Cheap checks over the text (nothing imported, nothing run): history belongs in git and CHANGELOG.md, so code and docs
name no issue numbers; where a doc restates a fact of the code (what the GPU rules ask for as threads, what a
finetune change reruns, how many trials tune runs, where a function lives), the fact is read from the code here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".smk", ".json", ".rst", ".toml", ".txt"}
# Where a reader meets the project as it is: the package, the workflow, the docs, the shipped configs, the tests and
# the benchmarks (their recorded results, benchmarks/results/, are records of past runs and stay as written).
PRESENT_TENSE = [
    "stagedyolo",
    "workflow",
    "docs",
    "README.md",
    "config",
    "profiles",
    "Snakefile",
    "examples",
    "tests",
    "benchmarks",
]
RECORDS = {REPO / "benchmarks" / "results"}
ISSUE_REFERENCE = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)
DOCS = ["README.md", "config/README.md", "docs", "profiles", "examples"]
# Files another change in flight is fixing, per check: skipped by the check, and each must still need it (the last
# test), so the list empties as they land.
AWAITING = {"issue numbers": set(), "threads": set(), "code names": set(), "report files": set()}


def outstanding(check: str, found: list[str]) -> list[str]:
    return [f for f in found if f.split(":", 1)[0] not in AWAITING[check]]


def text_files(roots: list[str]) -> list[Path]:
    files = []
    for root in roots:
        path = REPO / root
        if path.is_file():
            files.append(path)
        else:
            files += [
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Snakefile")
            ]
    return [p for p in files if "__pycache__" not in p.parts and not RECORDS.intersection(p.parents)]


def hits(pattern: re.Pattern, roots: list[str]) -> list[str]:
    found = []
    for path in text_files(roots):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    return found


def issue_numbers() -> list[str]:
    return hits(ISSUE_REFERENCE, PRESENT_TENSE)


def test_no_issue_numbers_in_code_or_docs():
    """A reader of the code or the docs cannot open an issue by its number: say the reason itself (the history is in
    git and CHANGELOG.md)."""
    assert outstanding("issue numbers", issue_numbers()) == []


def rule_threads() -> set[str]:
    """Every `threads:` expression the workflow's rules use."""
    return {
        match.group(1).strip()
        for path in sorted((REPO / "workflow" / "rules").glob("*.smk"))
        for match in re.finditer(r"^\s+threads:\s*(.+)$", path.read_text(), re.MULTILINE)
    }


def misquoted_threads() -> list[str]:
    used = rule_threads()
    return [
        f"{path.relative_to(REPO)}: threads: {match.group(1)}"
        for path in text_files(DOCS)
        for match in re.finditer(r"`threads: ([^`]+)`", path.read_text())
        if match.group(1) not in used
    ]


def test_docs_quote_the_threads_the_rules_ask_for():
    """Docs and profiles that quote a rule's `threads: ...` quote what the rules say."""
    assert rule_threads() and outstanding("threads", misquoted_threads()) == [], rule_threads()


def expected_reruns() -> set[str]:
    """The jobs tests/test_pipeline_e2e.py expects a finetune change to plan (its dict of rule names)."""
    tree = ast.parse((REPO / "tests" / "test_pipeline_e2e.py").read_text())
    test = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name == "test_changing_one_stage_reruns_exactly_it_and_what_follows"
    )
    planned = next(node for node in ast.walk(test) if isinstance(node, ast.Dict))
    return {key.value for key in planned.keys} - {"all"}


def test_the_readme_names_every_job_a_finetune_change_reruns():
    readme = (REPO / "README.md").read_text()
    bullet = readme[readme.index("**Only changed stages rerun.**") :].split("\n- ", 1)[0]
    named = set(re.findall(r"`(\w+)`", bullet))
    assert expected_reruns() <= named, expected_reruns() - named


def module_constant(path: str, name: str):
    tree = ast.parse((REPO / path).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in {path}")


def test_tune_docs_count_the_trials_tune_runs():
    """tune runs the baseline and at most MAX_ADVICE_TRIALS advice trials: docs/tune.md and the schema say so."""
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    advice = module_constant("stagedyolo/tune.py", "MAX_ADVICE_TRIALS")
    doc = " ".join((REPO / "docs" / "tune.md").read_text().split())
    assert f"one to {words[advice + 1]} **trials**" in doc
    assert f"at most {words[advice]} advice trials" in doc
    for path in ("workflow/schemas/config.schema.yaml", "config/README.md"):
        assert f"Costs one to {words[advice + 1]} short runs of the stage" in (REPO / path).read_text(), path


def defined_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {e.id for t in targets for e in ast.walk(t) if isinstance(e, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def module_file(parts: list[str]) -> Path | None:
    path = REPO.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return path / "__init__.py" if (path / "__init__.py").is_file() else None


def missing_code() -> list[str]:
    missing = []
    for path in text_files(["README.md", "config/README.md", "benchmarks/README.md", "docs"]):
        text, where = path.read_text(), path.relative_to(REPO)
        for match in re.finditer(r"(?<![\w/.-])((?:stagedyolo|workflow|tests)/[\w/.-]*\w)", text):
            if not (REPO / match.group(1)).exists():
                missing.append(f"{where}: {match.group(1)}")
        for match in re.finditer(r"`(stagedyolo(?:\.\w+)+)`", text):
            parts = match.group(1).split(".")
            prefix = next(n for n in range(len(parts), 0, -1) if module_file(parts[:n]) or n == 1)
            found = module_file(parts[:prefix])
            rest = parts[prefix:]
            if found is None or (rest and rest[0] not in defined_names(found)):
                missing.append(f"{where}: {match.group(1)}")
    return missing


def test_code_the_docs_name_exists():
    """A path (stagedyolo/..., workflow/..., tests/...) or a dotted name (`stagedyolo.x.y`) in the docs is there."""
    assert outstanding("code names", missing_code()) == []


def report_files_misnamed() -> list[str]:
    """docs/timing.md's list of what build_report writes, against stagedyolo/report.py's FILES."""
    written = set(module_constant("stagedyolo/report.py", "FILES").values())
    doc = (REPO / "docs" / "timing.md").read_text()
    paragraph = doc[doc.index("`build_report(stage_dirs, out_dir)` writes") :].split("\n\n", 1)[0]
    listed = {name.rstrip("/") for name in re.findall(r"`(\w+\.\w+|\w+/)`", paragraph)}
    return [f"docs/timing.md: {name}" for name in sorted(listed ^ written)]


def test_the_docs_list_the_files_the_report_writes():
    assert outstanding("report files", report_files_misnamed()) == []


def test_every_awaited_file_still_needs_its_fix():
    """Once a file in AWAITING is fixed, its entry goes, so the check covers it again."""
    found = {
        "issue numbers": issue_numbers(),
        "threads": misquoted_threads(),
        "code names": missing_code(),
        "report files": report_files_misnamed(),
    }
    fixed = {
        (check, path)
        for check, paths in AWAITING.items()
        for path in paths
        if not any(f.split(":", 1)[0] == path for f in found[check])
    }
    assert fixed == set()
