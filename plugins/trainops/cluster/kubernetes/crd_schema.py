"""What a cluster's CustomResourceDefinition says about a manifest, before it is sent. Pure.

An API server prunes the fields a CRD's structural schema does not define, silently: a
TrainJob rendered for another Trainer release would lose its spot placement, its service
account and its volumes, and still be created. So the backend reads the CRD the cluster
serves (once per backend), and a manifest with a field that schema does not know is refused
before launch, naming the field (:func:`unknown_fields`).
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]


def served_schema(crd: Json, version: str) -> Json | None:
    """The ``openAPIV3Schema`` of ``version`` in ``crd`` (the API's JSON form), or None when the
    CRD does not serve that version (or carries no schema)."""
    for entry in (crd.get("spec") or {}).get("versions") or []:
        if entry.get("name") == version and entry.get("served", True):
            schema = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, dict) else None
    return None


def served_versions(crd: Json) -> list[str]:
    """The versions ``crd`` serves, in its order."""
    return [
        str(v.get("name")) for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served", True)
    ]


def unknown_fields(obj: Any, schema: Json, path: str = "") -> list[str]:
    """The paths in ``obj`` (``.spec.trainer.envFrom``, ``.spec.items[0].x``) that ``schema``
    does not define, following ``properties``, ``items`` and ``additionalProperties``. A
    subtree marked ``x-kubernetes-preserve-unknown-fields`` without properties keeps anything.
    ``metadata`` of the object itself is the API server's (ObjectMeta), never pruned."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return []
    if "$ref" in schema:  # a reference (a Helm chart's schema) is not followed: taken as known
        return []
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None or extra is False:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def properties_at(schema: Json, path: list[str]) -> frozenset[str]:
    """The property names of the object at ``path`` (keys; an array's items are stepped into
    on the way), or an empty set when the schema has no such path."""
    node: Any = schema
    for key in path:
        while isinstance(node, dict) and node.get("type") == "array":
            node = node.get("items")
        node = ((node or {}).get("properties") or {}).get(key) if isinstance(node, dict) else None
        if node is None:
            return frozenset()
    while isinstance(node, dict) and node.get("type") == "array":
        node = node.get("items")
    return frozenset(((node or {}).get("properties") or {}) if isinstance(node, dict) else {})
