"""``python -m trainops render-job SPEC.json``: the dry run a user types."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.trainops.cluster.credential_cases import CREDENTIAL_IDS, CREDENTIALS
from trainops.cli.render_job import main as render_job_main

SPECS = Path(__file__).resolve().parents[2] / "data" / "jobspecs"


def render_job(path, *options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainops", "render-job", str(path), *options],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_prints_the_pytorchjob_as_yaml():
    out = render_job(SPECS / "pytorchjob-spot-volcano.json")
    assert out.returncode == 0, out.stderr
    (pj,) = list(yaml.safe_load_all(out.stdout))
    assert (pj["apiVersion"], pj["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert pj["metadata"]["namespace"] == "ml"
    assert pj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert pj["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "training"


def test_prints_service_then_indexed_job():
    out = render_job(SPECS / "indexed-job-kueue-on-demand.json")
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    assert docs[1]["spec"]["suspend"] is True
    assert "s3-credentials" in out.stdout


def test_unknown_fields_are_named(tmp_path):
    out = render_job(SPECS / "unknown-field.json")
    assert out.returncode == 2 and out.stdout == ""
    assert "['gpu', 'replicas']" in out.stderr


def spec_with_env(tmp_path, source: str, env: dict[str, str]) -> Path:
    spec = json.loads((SPECS / source).read_text())
    spec["env"] = {**spec.get("env", {}), **env}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_literal_credentials_fail_with_advice(tmp_path):
    env = {"AWS_SECRET_ACCESS_KEY": "hunter2", **{name: value for name, value, _ in CREDENTIALS}}
    out = render_job(spec_with_env(tmp_path, "indexed-job-kueue-on-demand.json", env))
    assert out.returncode == 2 and "hunter2" not in out.stdout + out.stderr
    assert not any(secret in out.stdout + out.stderr for _, _, secret in CREDENTIALS)
    assert "would be refused at launch" in out.stderr and "env_from_secrets" in out.stderr
    assert all(repr(name) in out.stderr for name in env)


@pytest.mark.parametrize("source", sorted(p.name for p in SPECS.glob("*-*-*.json")))
@pytest.mark.parametrize("name,value,secret", CREDENTIALS, ids=CREDENTIAL_IDS)
def test_a_literal_credential_is_printed_masked_and_named_as_refused(
    tmp_path, capsys, source, name, value, secret
):
    path = spec_with_env(tmp_path, source, {name: value})
    assert render_job_main(str(path)) == 2
    out = capsys.readouterr()
    assert secret not in out.out + out.err and value not in out.out + out.err
    docs = [d for d in yaml.safe_load_all(out.out) if d]  # the masked manifests still parse
    assert out.out.startswith("# NOT LAUNCHABLE") and docs[-1]["kind"] in ("Job", "PyTorchJob", "TrainJob")
    assert {"name": name, "value": "***"} in [e for doc in docs for e in envs_of(doc)]
    assert f"would be refused at launch: JobSpec env {name!r}" in out.err and "env_from_secrets" in out.err


def envs_of(doc: dict) -> list[dict]:
    """Every container env entry of a manifest, whatever its kind."""
    found = []
    stack: list[object] = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found += node.get("env", []) if isinstance(node.get("env"), list) else []
            stack += node.values()
        elif isinstance(node, list):
            stack += node
    return found


def test_missing_file_says_so(tmp_path):
    out = render_job(tmp_path / "nope.json")
    assert out.returncode == 2 and "no such file" in out.stderr


def test_prints_the_trainjob():
    out = render_job(SPECS / "trainjob-spot-kueue.json")
    assert out.returncode == 0, out.stderr
    (tj,) = list(yaml.safe_load_all(out.stdout))
    assert (tj["apiVersion"], tj["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert tj["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert tj["spec"]["trainer"]["numNodes"] == 2 and tj["spec"]["suspend"] is True
    assert tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    # the newest Trainer's shape: runtimePatches, placement as an affinity
    assert "podSpecOverrides" not in tj["spec"]
    (patch,) = tj["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} in term[
        "matchExpressions"
    ]
    env = {e["name"]: e for e in tj["spec"]["trainer"]["env"]}
    assert env["WANDB_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "wandb-credentials", "key": "api_key"}
    }


def test_an_older_trainer_release_gets_its_own_shape():
    out = render_job(SPECS / "trainjob-spot-kueue.json", "--trainer-release", "v2.0")
    assert out.returncode == 0, out.stderr
    (tj,) = list(yaml.safe_load_all(out.stdout))
    (override,) = tj["spec"]["podSpecOverrides"]
    assert override["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"


def test_what_a_trainjob_cannot_carry_fails_with_the_field_named(tmp_path):
    spec = json.loads((SPECS / "trainjob-spot-kueue.json").read_text())
    spec["spot_flavour"] = "auto"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert render_job(path).returncode == 0  # an affinity can say "any provider's spot"
    out = render_job(path, "--trainer-release", "v2.0")
    assert out.returncode == 2 and out.stdout == ""
    assert "spot_flavour 'auto'" in out.stderr and "nodeSelector" in out.stderr
