"""The Kubernetes client the doctor talks through: from an Airflow connection (the one the
operators use), a kubeconfig, or the pod's own service account. Returns what the backend
calls a hook: ``core_v1_client``, ``batch_v1_client``, ``custom_object_client``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_KUBECONFIG = Path.home() / ".kube" / "config"


class NoCluster(Exception):
    """No cluster is configured; the message says how to name one."""


@dataclass
class ClientHook:
    """The clients over one ``kubernetes.client.ApiClient``."""

    api_client: Any
    namespace: str | None = None

    def __post_init__(self) -> None:
        from kubernetes import client

        self.core_v1_client = client.CoreV1Api(self.api_client)
        self.batch_v1_client = client.BatchV1Api(self.api_client)
        self.custom_object_client = client.CustomObjectsApi(self.api_client)

    @property
    def server(self) -> str:
        return str(self.api_client.configuration.host)

    def get_namespace(self) -> str | None:
        return self.namespace


def kubeconfig_path(given: str | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The kubeconfig to use: ``given``, ``$KUBECONFIG`` (its first file), ``~/.kube/config``
    when it exists; None otherwise."""
    env = os.environ if environ is None else environ
    if given:
        return Path(given)
    if env.get("KUBECONFIG"):
        return Path(env["KUBECONFIG"].split(os.pathsep)[0])
    return DEFAULT_KUBECONFIG if DEFAULT_KUBECONFIG.exists() else None


def connect(
    *,
    conn_id: str | None,
    kubeconfig: str | None,
    context: str | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Any, str, str | None]:
    """``(hook, server, namespace)`` for the cluster named by the options, in this order: the
    Airflow connection ``conn_id``, the kubeconfig, the pod's service account (in a cluster).
    Raises NoCluster, one line, when none is configured or the one named cannot be loaded."""
    try:
        return _connect(conn_id=conn_id, kubeconfig=kubeconfig, context=context, environ=environ)
    except NoCluster:
        raise
    except Exception as exc:  # a bad kubeconfig or context, an unknown connection: say which, in one line
        source = (
            f"connection {conn_id!r}" if conn_id else f"kubeconfig {kubeconfig_path(kubeconfig, environ)}"
        )
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NoCluster(f"cannot use {source}: {type(exc).__name__}: {first}") from None


def _connect(
    *,
    conn_id: str | None,
    kubeconfig: str | None,
    context: str | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Any, str, str | None]:
    """:func:`connect`, letting the client's own errors through."""
    env = os.environ if environ is None else environ
    if conn_id:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        airflow_hook = KubernetesHook(conn_id=conn_id)
        return airflow_hook, str(airflow_hook.api_client.configuration.host), airflow_hook.get_namespace()
    from kubernetes import client, config

    path = kubeconfig_path(kubeconfig, env)
    if path is not None:
        if not path.exists():
            raise NoCluster(f"kubeconfig {path} does not exist: pass --kubeconfig PATH or fix $KUBECONFIG")
        api_client = config.new_client_from_config(config_file=str(path), context=context)
        _, active = config.list_kube_config_contexts(config_file=str(path))
        if context:
            active = next(
                (
                    c
                    for c in config.list_kube_config_contexts(config_file=str(path))[0]
                    if c["name"] == context
                ),
                active,
            )
        namespace = ((active or {}).get("context") or {}).get("namespace")
        from_file = ClientHook(api_client, namespace)
        return from_file, from_file.server, namespace
    if env.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        in_cluster = ClientHook(client.ApiClient(configuration))
        return in_cluster, in_cluster.server, None
    raise NoCluster(
        "no Kubernetes cluster configured: pass --kubeconfig PATH or --kubernetes-conn-id ID "
        "(an Airflow connection), or set KUBECONFIG"
    )
