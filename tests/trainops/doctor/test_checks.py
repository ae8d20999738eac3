"""The doctor's pure checks: what each line says for given facts."""

import pytest

from trainops.cluster.kubernetes.pools import Pool
from trainops.doctor import checks
from trainops.doctor.checks import Check


def pool(name, capacity, gpus, nodes=2, karpenter=False):
    return Pool(
        name=name,
        capacity_type=capacity,
        instance_type="p4d.24xlarge",
        nodes=nodes,
        ready=nodes,
        cpu_m=95000,
        memory=1 << 40,
        ephemeral_storage=1 << 40,
        gpus=gpus,
        karpenter=karpenter,
    )


def test_a_line_has_the_status_the_name_the_detail_and_the_fix_below():
    assert (
        Check("api", checks.FAIL, "x: 401", "fix it").line(6)
        == "FAIL  api    x: 401\n            fix: fix it"
    )
    assert Check("api", checks.PASS, "ok").line(6) == "PASS  api    ok"


def test_rbac_lines_group_verbs_by_resource_and_tell_required_from_optional():
    wanted = [
        ("create", "batch", "jobs", "namespace", True),
        ("get", "batch", "jobs", "namespace", True),
        ("get", "", "nodes", "cluster", False),
    ]
    found = checks.rbac_checks({("create", "batch", "jobs"): False, ("get", "batch", "jobs"): True}, wanted)
    assert [(c.name, c.status, c.detail) for c in found] == [
        ("rbac jobs", checks.FAIL, "jobs.batch: may not create"),
        ("rbac nodes", checks.WARN, "nodes: may not get (optional)"),
    ]


@pytest.mark.parametrize(
    "grace,flavour,save_s,status",
    [
        (60, "gke", 5.0, checks.FAIL),  # GKE gives 15 s whatever the grace: 12 usable < 15 needed
        (60, "gke", 1.0, checks.PASS),  # 11 s needed
        (60, "karpenter", 30.0, checks.PASS),  # 50 usable >= 40 needed
        (30, "karpenter", 30.0, checks.FAIL),  # the grace is the limit: 23 < 40
        (60, "aks", None, checks.WARN),
    ],
)
def test_the_notice_window_is_the_grace_cut_to_the_providers_window(grace, flavour, save_s, status):
    line = checks.notice_check(grace, flavour, "spot", save_s, "--save-seconds")
    assert line.status == status
    if status == checks.FAIL:
        assert "shorter than the emergency save" in line.detail and "checkpoint" in line.fix


def test_on_demand_needs_no_notice_and_no_spot_nodes():
    assert checks.notice_check(60, "gke", "on-demand", 500.0, "x").status == checks.INFO
    assert checks.spot_check([], "on-demand", "gke").status == checks.INFO


def test_spot_nodes_karpenter_may_make_them_later():
    assert checks.spot_check([pool("gpu", "spot", 8)], "spot", "karpenter").status == checks.PASS
    assert (
        checks.spot_check([pool("cpu", "on-demand", 0, karpenter=True)], "spot", "karpenter").status
        == checks.WARN
    )
    line = checks.spot_check([pool("cpu", "on-demand", 0)], "spot", "aks")
    assert line.status == checks.FAIL and "--priority Spot" in line.fix


def test_gpus_by_pool():
    assert checks.gpu_check([pool("a", "spot", 8)], 8).status == checks.PASS
    assert checks.gpu_check([pool("a", "spot", 4)], 8).status == checks.FAIL
    assert checks.gpu_check([pool("a", "spot", 0)], 0).status == checks.INFO


def test_storage_lines():
    ok = {"latency_ms": 12.3, "create_only": True, "compare_and_swap": True}
    assert [c.status for c in checks.storage_checks("s3://b/r", ok)] == [checks.PASS, checks.PASS]
    (_, cas) = checks.storage_checks("s3://b/r", {**ok, "create_only": False})
    assert (
        cas.status == checks.FAIL
        and "If-None-Match (create-only)" in cas.detail
        and "If-Match" not in cas.detail
    )
    (only,) = checks.storage_checks("s3://b/r", {"error": "NotFound: no bucket", "fix": "make it"})
    assert (only.name, only.status, only.fix) == ("storage", checks.FAIL, "make it")
