"""``python -m trainops render-job SPEC.json``: print the manifests a JobSpec would submit.

A dry run: reads a JobSpec in its JSON form, renders the Kubernetes manifests and prints them
as multi-document YAML. Nothing is sent to a cluster, so a TrainJob is rendered for the
newest Kubeflow Trainer release unless ``--trainer-release`` names an older one (the backend
reads the release from the cluster's CRD). A variable that looks like a literal credential is
printed as ``***``, and named on stderr as what launching would refuse (exit 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainops.cluster.credentials import MASK
from trainops.cluster.kubernetes import trainjob
from trainops.cluster.kubernetes.render import review_manifests, to_yaml
from trainops.cluster.spec import JobSpec, JobSpecError

# --trainer-release -> the TrainJob API of that Kubeflow Trainer release
TRAINER_RELEASES = {
    "v2.0": trainjob.TRAINER_V2_0,
    "v2.1": trainjob.TRAINER_V2_1,
    "v2.3": trainjob.TRAINER_V2_3,
}
NEWEST_RELEASE = "v2.3"


class RenderError(ValueError):
    """The spec file cannot be read or rendered; the message says what to change."""


def load_spec(path: str | Path):
    """Read a JobSpec's JSON form; unknown fields and bad values raise, naming them."""
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


def render(path: str | Path, trainer_release: str = NEWEST_RELEASE) -> tuple[str, str | None]:
    """The manifests for the JobSpec in ``path`` as multi-document YAML (a TrainJob for
    ``trainer_release``), every credential-like literal value masked (``***``), and why
    launching it would be refused for those (None: it would not;
    :func:`trainops.cluster.kubernetes.render.review_manifests`)."""
    spec = load_spec(path)
    try:
        manifests, refusal = review_manifests(spec, TRAINER_RELEASES[trainer_release])
    except JobSpecError as e:
        raise RenderError(f"{path}: {e}") from None
    return to_yaml(manifests), refusal


def main(path: str, trainer_release: str = NEWEST_RELEASE) -> int:
    """Print the manifests; 2 when the spec cannot be rendered, or would be refused at launch
    for a literal credential (then the manifests are printed masked, the refusal on stderr)."""
    try:
        text, refusal = render(path, trainer_release)
    except RenderError as e:
        print(f"render-job: {e}", file=sys.stderr)
        return 2
    if refusal:
        # a comment, so the manifests still parse; the exit status says they are not launchable
        sys.stdout.write(f"# NOT LAUNCHABLE: values shown as {MASK} look like literal credentials\n{text}")
        print(f"render-job: {path}: would be refused at launch: {refusal}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
