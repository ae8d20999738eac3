"""The README fits on a screen and its promises hold: the commands, the pictures, the docs map, the
DAG snippet. (The operator parameters moved to docs/operators.md: tests/trainops/cli/test_operator_docs.py.)"""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 220, "move the detail into docs/ and link to it"


def test_the_two_commands_come_first_and_exist_in_the_makefile():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test", "test-fast", "lint", "airflow", "clean-demo"):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
        assert f"make {target}" in README, target


def test_it_shows_at_least_two_screenshots_that_exist():
    images = re.findall(r"!\[[^\]]+\]\((docs/img/[\w.-]+\.png)\)", README)
    assert len(images) >= 2
    assert all((REPO / image).is_file() for image in images)


def test_the_docs_map_names_every_doc_once():
    mapped = re.findall(r"^\| \[docs/([\w-]+\.md)\]\(docs/\1\) \|", README, re.M)
    on_disk = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert sorted(mapped) == on_disk
    assert len(mapped) == len(set(mapped))


def test_the_dag_snippet_builds_the_five_task_pipeline():
    from airflow.sdk import DAG

    (snippet,) = re.findall(r"```python\n(.*?)```", README, re.S)
    with DAG("readme_snippet", schedule=None) as dag:
        exec(snippet, {})
    assert [t.task_id for t in dag.topological_sort()] == ["stage", "train", "evaluate", "gate", "promote"]


def test_the_trainops_commands_it_names_exist():
    out = subprocess.run(
        [sys.executable, "-m", "trainops", "--help"], capture_output=True, text=True, timeout=120
    )
    choices = set(re.search(r"\{([a-z,-]+)\}", out.stdout).group(1).split(","))
    named = set(re.findall(r"python -m trainops ([a-z-]+)", README))
    assert named and named <= choices, named - choices
