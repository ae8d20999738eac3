"""``python -m trainops doctor``: the table a user reads, its exit status, and each scenario of
issue #29 failing exactly its own line, against the simulated control plane and real storage
(a file root; moto's S3, behind our proxy where the store must ignore conditional writes)."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.trainops.doctor.scenarios import SERVER, healthy_plane
from trainops.cli import doctor
from trainops.doctor import checks


def parse(*argv):
    parser = argparse.ArgumentParser()
    doctor.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["doctor", *argv])


BASE = (
    "--namespace",
    "ml",
    "--spot-flavour",
    "gke",
    "--grace-seconds",
    "15",
    "--save-seconds",
    "1",
    "--no-airflow",
)


def run(capsys, plane, *argv):
    status = doctor.main(parse(*BASE, *argv), hook=plane, server=SERVER)
    return status, capsys.readouterr().out


def failed_lines(out):
    return [line.split()[1] for line in out.splitlines() if line.startswith("FAIL")]


def test_a_healthy_cluster_and_store_pass_with_exit_status_0(capsys, file_root):
    status, out = run(capsys, healthy_plane(), "--storage-root", file_root)
    assert status == 0, out
    assert failed_lines(out) == []
    assert out.splitlines()[0].startswith("PASS  api")
    assert "PASS  conditional writes" in out and "PASS  notice window" in out
    assert out.splitlines()[-1].endswith("0 failed, 0 could not be made")


def scenario_no_create_jobs(plane, argv):
    plane.denied.add(("create", "jobs"))
    return "rbac"


def scenario_no_trainjob_crd(plane, argv):
    plane.crds.discard("trainjobs")
    argv += ["--kind", "trainjob"]
    return "crd"


def scenario_no_spot_nodes(plane, argv):
    for node in plane.nodes.values():
        node["metadata"]["labels"].pop("cloud.google.com/gke-spot")
    return "spot"


def scenario_notice_too_short(plane, argv):
    argv += ["--save-seconds", "20"]  # GKE gives 15 s: 12 of them for the save, which needs 30
    return "notice"


@pytest.mark.parametrize(
    "scenario",
    [scenario_no_create_jobs, scenario_no_trainjob_crd, scenario_no_spot_nodes, scenario_notice_too_short],
)
def test_each_fault_fails_exactly_its_own_line_with_the_fix(capsys, file_root, scenario):
    plane, argv = healthy_plane(), ["--storage-root", file_root]
    line = scenario(plane, argv)
    status, out = run(capsys, plane, *argv)
    assert status == 1
    assert failed_lines(out) == [line], out
    failing = out[out.index("FAIL") :].splitlines()
    assert failing[1].strip().startswith("fix: ")


def test_a_store_without_conditional_writes_fails_only_that_line(capsys, faulty_s3_root, s3_faults):
    s3_faults.drop_headers = frozenset({"if-none-match", "if-match"})
    status, out = run(capsys, healthy_plane(), "--storage-root", faulty_s3_root)
    assert status == 1 and failed_lines(out) == ["conditional"], out
    assert "If-None-Match (create-only) and If-Match (compare-and-swap)" in out
    assert "PASS  storage" in out


def test_json_output(capsys, file_root):
    status = doctor.main(
        parse(*BASE, "--storage-root", file_root, "--json"), hook=healthy_plane(), server=SERVER
    )
    found = json.loads(capsys.readouterr().out)
    assert status == 0 and {c["name"] for c in found} >= {"api", "namespace", "rbac jobs", "storage"}
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in found)


def test_no_storage_root_fails_naming_the_variable(capsys, monkeypatch):
    monkeypatch.delenv("TRAINOPS_STORAGE_ROOT", raising=False)
    status, out = run(capsys, healthy_plane())
    assert status == 1 and failed_lines(out) == ["storage"] and "TRAINOPS_STORAGE_ROOT" in out


def test_no_cluster_configured_is_one_line_and_no_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    done = subprocess.run(
        [sys.executable, "-m", "trainops", "doctor", "--storage-root", f"file://{tmp_path}/root"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "doctor: no Kubernetes cluster configured: pass --kubeconfig PATH or --kubernetes-conn-id ID "
        "(an Airflow connection), or set KUBECONFIG"
    ]


def test_the_cli_reads_a_kubeconfig_and_an_unreachable_server_fails_the_api_line(tmp_path):
    """A real kubeconfig naming a server nobody listens on: the api line fails in seconds."""
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainops", "doctor", "--kubeconfig", str(config), "--no-airflow"],
        capture_output=True,
        text=True,
        env={**os.environ, "TRAINOPS_STORAGE_ROOT": f"file://{tmp_path}/root"},
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL  api") and "https://127.0.0.1:9" in lines[0]
    assert checks.PASS.upper() + "  storage" in done.stdout


def test_an_unknown_scheduler_is_refused_in_one_line(capsys, file_root):
    assert (
        doctor.main(
            parse(*BASE, "--scheduler", "keueu:q", "--storage-root", file_root),
            hook=healthy_plane(),
            server=SERVER,
        )
        == 2
    )
    assert (
        capsys.readouterr().err.strip()
        == "doctor: --scheduler 'keueu:q': expected default, kueue:<queue> or volcano[:<queue>]"
    )
