"""What README.md and docs/*.md say that can drift from the code: links, the RBAC rules, the shared
trainer modules."""

import re
from pathlib import Path

import pytest
import yaml

from trainer.contract import SHARED_MODULES

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RBAC = REPO / "docker" / "deploy" / "base" / "rbac.yaml"
VERBS = ("create", "get", "list", "watch", "delete", "patch", "update", "deletecollection")


def prose(path: Path) -> str:
    """The file without its fenced code blocks (their `#` lines are not headings, nor links)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path), re.M):
        base, n = slug(heading), 0
        while (candidate := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(candidate)
    return found


def headings(path: Path) -> set[str]:
    return {h.strip() for h in re.findall(r"^#{1,6} (.+)$", prose(path), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file_and_anchor(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(path):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_doc_and_section_exists(doc):
    """`docs/x.md, "Section"` (the docs' way to point at a section in running text)."""
    text = re.sub(r"\s+", " ", doc.read_text())
    missing = [m for m in re.findall(r"docs/[\w-]+\.md", text) if not (REPO / m).exists()]
    for name, section in re.findall(r"(docs/[\w-]+\.md)`?,? \"([^\"]+)\"", text):
        if (REPO / name).exists() and not any(
            h.replace("`", "").startswith(section.replace("`", "")) for h in headings(REPO / name)
        ):
            missing.append(f'{name}, "{section}"')
    assert missing == []


def rbac_rules() -> dict[str, set[str]]:
    """resource -> verbs granted by docker/deploy/base/rbac.yaml's Role and ClusterRole."""
    rules: dict[str, set[str]] = {}
    for obj in yaml.safe_load_all(RBAC.read_text()):
        if obj and obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj["rules"]:
                for resource in rule["resources"]:
                    rules.setdefault(resource, set()).update(rule["verbs"])
    return rules


_VERB = "|".join(VERBS)
_VERB_LIST = rf"(?:{_VERB})(?:(?:, | and |/| or )(?:{_VERB}))*"
_RESOURCE = r"`([a-z]+(?:/[a-z]+)?)`"


def rbac_mentions(text: str) -> list[tuple[str, set[str]]]:
    """Each place a doc grants verbs on a resource, in the forms the docs use: the table row
    ``| `group` `resource`: verbs |``, the prose ``resource: verbs`` / ``resource verbs``, and
    ``verbs on `resource```."""
    text = re.sub(r"\s+", " ", text)
    found = []
    for resource, verbs in re.findall(rf"{_RESOURCE}:? ({_VERB_LIST})\b", text):
        found.append((resource, set(re.findall(_VERB, verbs))))
    for verbs, resource in re.findall(rf"\b({_VERB_LIST}) on {_RESOURCE}", text):
        found.append((resource, set(re.findall(_VERB, verbs))))
    return found


def test_the_deploying_guide_lists_every_rbac_rule_as_rbac_yaml_grants_it():
    table = re.findall(
        r"^\| (?:ClusterRole )?(?:`[\w.]+` )?`([a-z/]+)`: ([a-z, ]+) \|",
        prose(REPO / "docs/deploying.md"),
        re.M,
    )
    documented = {resource: set(verbs.split(", ")) for resource, verbs in table}
    assert documented == rbac_rules()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_names_rbac_verbs_that_rbac_yaml_does_not_grant(doc):
    rules = rbac_rules()
    wrong = [
        f"{resource}: {sorted(verbs)}, rbac.yaml grants {sorted(rules.get(resource, ()))}"
        for resource, verbs in rbac_mentions(doc.read_text())
        if resource in rules and verbs != rules[resource]
    ]
    assert wrong == []


def test_rbac_mentions_reads_the_forms_the_docs_use():
    assert rbac_mentions("| `batch` `jobs`: create, get, list, delete | kind |") == [
        ("jobs", {"create", "get", "list", "delete"})
    ]
    assert rbac_mentions("create/get/list/watch/delete on `pods`") == [
        ("pods", {"create", "get", "list", "watch", "delete"})
    ]
    assert rbac_mentions("get, list and\n watch on `events`; `services` create, delete") == [
        ("services", {"create", "delete"}),
        ("events", {"get", "list", "watch"}),
    ]


def shared_module_lists(text: str) -> list[set[str]]:
    """The sets of trainer modules each paragraph or list item that names SHARED_MODULES lists."""
    lists = []
    for block in re.split(r"\n\s*\n|\n(?=\s*- )", text):
        if "SHARED_MODULES" in block:
            modules = set(re.findall(r"`(trainer\.\w+)`", block))
            if len(modules) >= 2:
                lists.append(modules)
    return lists


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_shared_trainer_modules_named_are_shared_modules(doc):
    for modules in shared_module_lists(doc.read_text()):
        assert modules == set(SHARED_MODULES)


def test_the_readme_names_the_shared_modules():
    assert set(SHARED_MODULES) in shared_module_lists((REPO / "README.md").read_text())
