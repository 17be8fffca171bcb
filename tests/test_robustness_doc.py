"""Every row of docs/robustness.md names tests that exist (and so run, and must pass, with the suite)."""

import ast
import re

from snakemake_runner import REPO


def test_every_row_names_an_existing_test():
    doc = (REPO / "docs" / "robustness.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and not line.startswith(("| bad", "|---"))]
    assert len(rows) >= 20
    for row in rows:
        refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row)
        assert refs, f"row names no test: {row[:80]}"
        for path, name in refs:
            tree = ast.parse((REPO / path).read_text())
            names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name in names, f"{path}::{name} does not exist"
