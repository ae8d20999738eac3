"""docker/compose.yaml, checked without Docker: the paths it references exist, the variables it
needs are documented, and the environment it gives Airflow is what trainops reads."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.test_docker import AIRFLOW_DOCKERFILE, REPO, copy_sources, parse_dockerfile, stage_chain

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
SECRET_VARIABLES = ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD")
_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``."""

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match["name"] or match["bare"], match["op"], match["arg"]
        value = env.get(name)
        if op is None:
            return value or ""
        if value is None or (op.startswith(":") and value == ""):
            if op.endswith("?"):
                raise ValueError(f"{name}: {arg}")
            return arg
        return value

    return _VARIABLE.sub(substitute, value)


def _resolve(node, env):
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _resolve(value, env) for key, value in node.items()}
    return node


def _env_file(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def example_env():
    return _env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def compose(raw, example_env):
    """The compose file as `docker compose config` sees it with docker/.env = .env.example."""
    return _resolve(raw, example_env)


@pytest.fixture(scope="module")
def airflow_env(compose):
    env = compose["services"]["airflow"]["environment"]
    assert isinstance(env, dict), "write the airflow service's environment as a mapping"
    return {key: str(value) for key, value in env.items()}


def _variables(node) -> set[str]:
    text = yaml.safe_dump(node)
    return {m["name"] or m["bare"] for m in _VARIABLE.finditer(text) if m.group(0) != "$$"}


# ----------------------------------------------------------------------------- interpolation


def test_interpolation_follows_compose_rules():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("a-${SET}-$SET-$$SET", env) == "a-v-v-$SET"
    assert interpolate("${EMPTY:-d} ${EMPTY-d} ${MISSING-d} ${MISSING:-d}", env) == "d  d d"
    with pytest.raises(ValueError, match="MISSING: say why"):
        interpolate("${MISSING:?say why}", env)
    with pytest.raises(ValueError, match="EMPTY"):
        interpolate("${EMPTY:?no}", env)


def test_every_variable_is_documented_and_credentials_have_no_defaults(raw, example_env):
    used = _variables(raw)
    assert used <= set(example_env), f"document {sorted(used - set(example_env))} in .env.example"
    assert set(example_env) <= used, f".env.example documents unused {sorted(set(example_env) - used)}"
    for name in SECRET_VARIABLES:
        assert example_env[name], f"{name} needs a documented development value"
        uses = re.findall(rf"\$\{{{name}(:?[-?])?[^}}]*\}}", COMPOSE.read_text())
        assert uses and all(op == ":?" for op in uses), f"{name} must be required (:?), not defaulted"
        assert example_env[name] not in COMPOSE.read_text(), f"compose.yaml spells out {name}"
    # without docker/.env, compose refuses to start instead of running with empty credentials
    with pytest.raises(ValueError, match="MINIO_ROOT_"):
        _resolve(raw, {})


# ----------------------------------------------------------------------------- paths


def test_build_context_dockerfile_and_target_exist(compose):
    build = compose["services"]["airflow"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == AIRFLOW_DOCKERFILE
    _, stages = parse_dockerfile(AIRFLOW_DOCKERFILE)
    assert build["target"] in [stage.name for stage in stages]
    assert build["target"] == "dev", "the local backend trains in the Airflow container: it needs torch"


def test_bind_mounts_exist_and_land_where_the_image_installed_the_code(compose):
    _, stages = parse_dockerfile(AIRFLOW_DOCKERFILE)
    target = next(
        stage for stage in stages if stage.name == compose["services"]["airflow"]["build"]["target"]
    )
    copies = [
        (src.rstrip("/"), dst.rstrip("/"))
        for stage in stage_chain(stages, target)
        for src, dst in copy_sources(stage)
    ]
    mounted = set()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, container_path = volume.split(":")[:2]
            if not source.startswith((".", "/")):
                assert source in compose.get("volumes", {}), f"{name}: undeclared volume {source}"
                continue
            host = (DOCKER / source).resolve()
            assert host.exists(), f"{name} mounts {source}, which does not exist"
            relative = host.relative_to(REPO).as_posix()
            # the image copied this directory (or a part of it) to the same place
            landed = [(src, dst) for src, dst in copies if src == relative or src.startswith(relative + "/")]
            assert any(dst == container_path + src[len(relative) :] for src, dst in landed), (
                f"{name} mounts {relative} at {container_path}, but the image put it at {landed}"
            )
            mounted.add(relative)
        for env_file in service.get("env_file", []):
            path = env_file["path"] if isinstance(env_file, dict) else env_file
            assert (DOCKER / path).exists() or (
                isinstance(env_file, dict) and env_file.get("required") is False
            )
    assert {"dags", "plugins", "trainer"} <= mounted


# ----------------------------------------------------------------------------- connections and env


def _operator_conn_defaults() -> dict[str, set[str]]:
    import trainops.operators as operators

    defaults: dict[str, set[str]] = {}
    for name in operators.__all__:
        for param in inspect.signature(getattr(operators, name).__init__).parameters.values():
            if param.name.endswith("_conn_id") and isinstance(param.default, str):
                defaults.setdefault(param.default, set()).add(param.name)
    return defaults


def test_connections_are_the_ones_the_operators_default_to(airflow_env):
    from airflow.models.connection import Connection

    defaults = _operator_conn_defaults()
    assert defaults["aws_default"] == {"aws_conn_id"}
    assert defaults["kubernetes_default"] == {"kubernetes_conn_id"}
    conns = {
        key.removeprefix("AIRFLOW_CONN_").lower(): value
        for key, value in airflow_env.items()
        if key.startswith("AIRFLOW_CONN_")
    }
    assert "aws_default" in conns, "s3:// storage needs the operators' default aws connection"
    expected_type = {"aws_default": "aws", "kubernetes_default": "kubernetes"}
    for conn_id, value in conns.items():
        assert conn_id in defaults, f"no trainops operator uses connection {conn_id!r}"
        conn = Connection.from_json(value, conn_id=conn_id)
        # Airflow's existing types: `aws` (Amazon provider), `kubernetes` (cncf-kubernetes)
        assert conn.conn_type == expected_type[conn_id]
    reports_conn = airflow_env.get("TRAINOPS_REPORTS_AWS_CONN_ID") or "aws_default"
    assert reports_conn in conns, "the report app reads reports through an undefined connection"


def test_aws_connection_reaches_minio_through_trainops_own_reader(
    compose, airflow_env, example_env, monkeypatch
):
    from trainops.hooks.storage import _connection_options, job_env_for

    for key, value in airflow_env.items():
        monkeypatch.setenv(key, value)
    options = _connection_options("aws_default")
    endpoint = urlsplit(options["endpoint_url"])
    assert endpoint.hostname in compose["services"], f"{endpoint.hostname} is not a compose service"
    assert endpoint.hostname == "minio" and endpoint.port == 9000
    assert options["region"] == "us-east-1"
    assert (options["aws_access_key_id"], options["aws_secret_access_key"]) == (
        example_env["MINIO_ROOT_USER"],
        example_env["MINIO_ROOT_PASSWORD"],
    )
    # the local backend's trainer processes: endpoint and region from the connection, keys
    # from the container's environment (what a pod's service account would give)
    job_env = job_env_for(airflow_env["TRAINOPS_STORAGE_ROOT"], "aws_default")
    assert job_env == {"AWS_ENDPOINT_URL_S3": options["endpoint_url"], "AWS_REGION": "us-east-1"}
    assert {airflow_env[k] for k in ("AWS_ENDPOINT_URL_S3", "AWS_REGION")} == set(job_env.values())
    assert airflow_env["AWS_ACCESS_KEY_ID"] == options["aws_access_key_id"]
    assert airflow_env["AWS_SECRET_ACCESS_KEY"] == options["aws_secret_access_key"]


def test_storage_root_is_the_created_bucket_and_what_settings_reads(compose, airflow_env, monkeypatch):
    from trainops.reports.app import allowed_roots
    from trainops.settings import default_storage_root

    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", airflow_env["TRAINOPS_STORAGE_ROOT"])
    monkeypatch.delenv("TRAINOPS_REPORT_ROOTS", raising=False)
    root = default_storage_root()
    assert root == airflow_env["TRAINOPS_STORAGE_ROOT"] and root.startswith("s3://")
    assert allowed_roots() == [root]
    bucket = urlsplit(root).netloc
    command = compose["services"]["create-bucket"]["command"]
    assert command[0] == "mb" and command[-1] == f"minio/{bucket}"
    mc_host = urlsplit(compose["services"]["create-bucket"]["environment"]["MC_HOST_minio"])
    assert (mc_host.hostname, mc_host.port) == ("minio", 9000)


def test_trainops_variables_are_ones_the_code_reads(airflow_env):
    sources = "\n".join(
        p.read_text() for folder in ("plugins/trainops", "trainer") for p in (REPO / folder).rglob("*.py")
    )
    for key in airflow_env:
        if key.startswith("TRAINOPS_"):
            assert f'"{key}"' in sources, f"nothing in trainops reads {key}"
    assert "TRAINOPS_STORAGE_ROOT" in airflow_env


# ----------------------------------------------------------------------------- services


def test_services_are_healthchecked_and_start_in_order(compose):
    services = compose["services"]
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
        if "healthcheck" in service:
            assert service["healthcheck"]["test"][0] == "CMD"  # exec form, no shell
        if "command" in service:
            assert isinstance(service["command"], list), f"{name}: write the command as a list"
    assert services["airflow"]["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert "healthcheck" in services["airflow"] and "healthcheck" in services["minio"]


def test_airflow_runs_as_the_image_user_and_publishes_only_on_localhost(compose):
    airflow = compose["services"]["airflow"]
    assert str(airflow.get("user", "airflow")).split(":")[0] not in ("0", "root")
    assert "privileged" not in airflow and "no-new-privileges:true" in airflow.get("security_opt", [])
    for service in compose["services"].values():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{port} listens beyond this machine"
