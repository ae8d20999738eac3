"""Which cluster the doctor talks to: a kubeconfig (given, $KUBECONFIG, ~/.kube/config), the
pod's service account, or none, said in one message."""

import pytest
import yaml

from trainops.doctor import kube

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://10.1.2.3:6443"}}],
    "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    "contexts": [
        {"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "ml"}},
        {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}},
    ],
    "current-context": "main",
}


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    return path


def test_a_kubeconfig_gives_the_server_and_the_contexts_namespace(config):
    hook, server, namespace = kube.connect(conn_id=None, kubeconfig=str(config), context=None, environ={})
    assert (server, namespace) == ("https://10.1.2.3:6443", "ml")
    assert hook.core_v1_client.api_client is hook.api_client
    _, _, other = kube.connect(conn_id=None, kubeconfig=str(config), context="other", environ={})
    assert other == "team-b"


def test_kubeconfig_from_the_environment(config):
    assert kube.kubeconfig_path(None, {"KUBECONFIG": f"{config}:/elsewhere"}) == config


def test_no_cluster_is_one_message(monkeypatch, tmp_path):
    monkeypatch.setattr(kube, "DEFAULT_KUBECONFIG", tmp_path / "absent")
    with pytest.raises(kube.NoCluster, match="no Kubernetes cluster configured: pass --kubeconfig"):
        kube.connect(conn_id=None, kubeconfig=None, context=None, environ={})
    with pytest.raises(kube.NoCluster, match="does not exist"):
        kube.connect(conn_id=None, kubeconfig=str(tmp_path / "nope"), context=None, environ={})


def test_a_context_or_kubeconfig_that_cannot_be_used_is_one_line(config, tmp_path):
    with pytest.raises(kube.NoCluster, match=r"cannot use kubeconfig .*: ConfigException: .*nope") as err:
        kube.connect(conn_id=None, kubeconfig=str(config), context="nope", environ={})
    assert "\n" not in str(err.value)
    empty = tmp_path / "empty"
    empty.write_text("{}")
    with pytest.raises(kube.NoCluster, match="cannot use kubeconfig"):
        kube.connect(conn_id=None, kubeconfig=str(empty), context=None, environ={})
