"""Render the deploy kit's kustomizations without kubectl, so the kit's tests run everywhere.

Only what the kit uses: ``resources`` (files and folders), ``components``, and ``patches`` that
are strategic-merge patch files adding map entries (annotations, labels). Anything else in a
kustomization fails here by name: a kit that grows a feature grows this renderer, and the tests
compare it with ``kubectl kustomize`` wherever kubectl is installed.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "components", "patches"}


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render, or one kustomize would refuse."""


def object_id(doc: dict) -> tuple[str, str, str, str]:
    """What kustomize tells objects apart by: apiVersion, kind, namespace, name."""
    meta = doc.get("metadata") or {}
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


def merge(target: dict, patch: dict, where: str) -> None:
    """A strategic-merge patch of maps only: a list in the patch would need the field's merge
    key, which this renderer does not know."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value, f"{where}.{key}")
        elif isinstance(value, list):
            raise KustomizeError(f"{where}.{key}: a list in a patch is not supported by this renderer")
        else:
            target[key] = copy.deepcopy(value)


def _load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _add(objects: list[dict], new: list[dict], where: Path) -> None:
    seen = {object_id(o) for o in objects}
    for doc in new:
        if object_id(doc) in seen:
            raise KustomizeError(f"{where}: {object_id(doc)} is there twice")
        seen.add(object_id(doc))
        objects.append(doc)


def _patch(objects: list[dict], entry: dict, root: Path) -> None:
    if set(entry) != {"path"}:
        raise KustomizeError(f"{root}: patch {entry} (only `path:` to a strategic-merge patch file)")
    for patch in _load(root / entry["path"]):
        matches = [o for o in objects if object_id(o) == object_id(patch)]
        if not matches:
            raise KustomizeError(f"{root / entry['path']}: no object {object_id(patch)} to patch")
        body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}
        merge(matches[0], body, f"{entry['path']}")


def render(folder: Path, components: tuple[Path, ...] = (), *, component: bool = False) -> list[dict]:
    """The objects ``kubectl kustomize folder`` prints, with ``components`` added after the
    folder's own (as a kustomization listing them would)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{folder}: {sorted(unknown)} not supported by this renderer")
    if (kustomization["kind"] == "Component") != component:
        raise KustomizeError(
            f"{folder}: a {kustomization['kind']} where a {'Component' if component else 'Kustomization'} belongs"
        )
    objects: list[dict] = []
    for entry in kustomization.get("resources") or []:
        path = folder / entry
        _add(objects, render(path) if path.is_dir() else _load(path), folder)
    for path in [folder / c for c in kustomization.get("components") or []] + list(components):
        comp = yaml.safe_load((path / "kustomization.yaml").read_text())
        render(path, component=True)  # checks the component itself
        _add(objects, [d for e in comp.get("resources") or [] for d in _load(path / e)], path)
        for entry in comp.get("patches") or []:
            _patch(objects, entry, path)
    for entry in kustomization.get("patches") or []:
        _patch(objects, entry, folder)
    return objects


def kubectl() -> str | None:
    return shutil.which("kubectl")


def kubectl_render(folder: Path, components: tuple[Path, ...] = (), tmp: Path | None = None) -> list[dict]:
    """``kubectl kustomize``'s rendering; with ``components``, of a kustomization in ``tmp``
    that lists ``folder`` and them."""
    if components:
        assert tmp is not None
        (tmp / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    # kustomize takes relative paths only
                    "resources": [os.path.relpath(folder.resolve(), tmp.resolve())],
                    "components": [os.path.relpath(c.resolve(), tmp.resolve()) for c in components],
                }
            )
        )
        folder = tmp
    result = subprocess.run(
        [kubectl() or "kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        raise KustomizeError(result.stderr)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_id(objects: list[dict]) -> dict[tuple[str, str, str, str], dict]:
    return {object_id(o): o for o in objects}
