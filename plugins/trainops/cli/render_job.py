"""``python -m trainops render-job SPEC.json``: print the manifests a JobSpec would submit.

A dry run: reads a JobSpec in its JSON form, renders the Kubernetes manifests and prints them
as multi-document YAML. Nothing is sent to a cluster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


class RenderError(ValueError):
    """The spec file cannot be read or rendered; the message says what to change."""


def load_spec(path: str | Path):
    """Read a JobSpec's JSON form; unknown fields and bad values raise, naming them."""
    from trainops.cluster.spec import JobSpec, JobSpecError

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RenderError(f"{path}: no such file; pass the path of a JobSpec JSON file") from None
    except json.JSONDecodeError as e:
        raise RenderError(f"{path}: not valid JSON ({e}); a JobSpec is one JSON object") from None
    if not isinstance(data, dict):
        raise RenderError(f"{path}: a JobSpec is a JSON object, got {type(data).__name__}")
    try:
        return JobSpec.from_dict(data)
    except JobSpecError as e:
        raise RenderError(f"{path}: {e}") from None
    except TypeError as e:  # a required field is missing
        raise RenderError(f"{path}: {e}; 'name' and 'args' are required") from None


def render(path: str | Path) -> str:
    """The manifests for the JobSpec in ``path`` as multi-document YAML."""
    from trainops.cluster.kubernetes.render import render_manifests, to_yaml
    from trainops.cluster.spec import JobSpecError

    spec = load_spec(path)
    try:
        return to_yaml(render_manifests(spec))
    except JobSpecError as e:
        raise RenderError(f"{path}: {e}") from None


def main(path: str) -> int:
    try:
        sys.stdout.write(render(path))
    except RenderError as e:
        print(f"render-job: {e}", file=sys.stderr)
        return 2
    return 0
