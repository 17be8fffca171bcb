"""Snakemake catalog conventions: formatted and lint-free .smk files, a config README that matches the schema.

snakefmt and `snakemake --lint` run here, as tests, so that the README's one test command (which .ci/run runs
unchanged) checks them too, and a developer's plain `pytest` fails on them before CI does.
"""

import re
import subprocess
from pathlib import Path

import yaml
from snakemake_runner import REPO, SNAKEMAKE

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def run_tool(*argv):
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_every_snakefile_is_formatted_by_snakefmt():
    result = run_tool(str(Path(SNAKEMAKE).with_name("snakefmt")), "--check", ".")
    assert result.returncode == 0, f"run `snakefmt .` and commit:\n{result.stdout}{result.stderr}"


def test_the_workflow_passes_snakemakes_linter():
    result = run_tool(SNAKEMAKE, "--lint")
    assert result.returncode == 0, result.stdout + result.stderr


def schema_keys(properties: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, node in properties.items():
        if key in ("stage_defaults", "stages"):
            continue
        if node.get("type") == "object" and node.get("properties"):
            keys |= schema_keys(node["properties"], f"{prefix}{key}.")
        else:
            keys.add(prefix + key)
    return keys


def test_config_readme_documents_exactly_the_schemas_keys():
    readme = (REPO / "config" / "README.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", readme, flags=re.M))
    expected = schema_keys(SCHEMA["properties"]) | set(SCHEMA["$defs"]["stage"]["properties"])
    assert documented == expected, (
        f"config/README.md lacks {sorted(expected - documented)}, documents removed {sorted(documented - expected)}"
    )


def test_the_catalog_file_declares_usage_and_the_test_config_is_the_tiny_one():
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    assert {"mandatory-flags", "software-stack-deployment", "report"} <= set(catalog["usage"])
    assert (REPO / "tests" / "configs" / "tiny.yaml").resolve() == (REPO / ".test" / "config" / "config.yaml")
