"""The run contract, parts 1 and 2: how a launcher starts the trainer (its command line, under
torchrun for ``train``, and the environment it sets besides torchrun's own)."""

from collections.abc import Mapping

TRAINER_COMMANDS = ("train", "evaluate", "export")


# --- 1. command line ------------------------------------------------------------
def trainer_argv(
    command: str, config_uri: str, overrides: Mapping[str, object] | None = None, python: str = "python"
) -> list[str]:
    """``python -m trainer COMMAND --config URI k=v ...`` as an argument list."""
    if command not in TRAINER_COMMANDS:
        raise ValueError(f"unknown trainer command {command!r}; expected one of {TRAINER_COMMANDS}")
    argv = [python, "-m", "trainer", command, "--config", config_uri]
    for key, value in (overrides or {}).items():
        argv.append(f"{key}={_override_value(value)}")
    return argv


def _override_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def torchrun_argv(
    trainer_args: list[str],
    *,
    nnodes: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    node_rank: int | None = None,
    shutdown_timeout_s: int = 30,
    is_host: bool | None = None,
    restarts_in_place: int = 0,
) -> list[str]:
    """Wrap ``python -m trainer ...`` (as from :func:`trainer_argv`) in torchrun.

    Rendezvous is c10d at ``rdzv_endpoint``. ``shutdown_timeout_s`` is how long torchrun
    waits for its workers after SIGTERM before SIGKILL: it must fit inside the pod's
    grace period, and it is the emergency checkpoint's budget.

    ``restarts_in_place`` is torchrun's ``--max-restarts``: how often a node's agent restarts
    its workers, in the same pod, after one of them failed (a killed worker, an exception, a
    peer gone); the gang re-forms and resumes from the newest checkpoint, from the node-local
    tier where it holds it (``trainer.runtime.restarts``). Once they are spent, torchrun exits
    and the operator relaunches the whole gang.
    """
    if restarts_in_place < 0:
        raise ValueError(f"restarts_in_place must be >= 0, got {restarts_in_place}")
    if trainer_args[1:3] != ["-m", "trainer"]:
        raise ValueError(f"expected 'python -m trainer ...', got {trainer_args[:3]}")
    argv = [
        trainer_args[0],
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--shutdown-timeout={shutdown_timeout_s}",
        f"--max-restarts={restarts_in_place}",  # then a whole-gang relaunch, owned by the operator
    ]
    if node_rank is not None:
        argv.append(f"--node-rank={node_rank}")
    if is_host is not None:
        argv.append(f"--rdzv-conf=is_host={1 if is_host else 0}")
    argv += ["-m", "trainer", *trainer_args[3:]]
    return argv


# --- 2. environment -------------------------------------------------------------
# For torchrun itself, beside its arguments. Since torch 2.4 its agents share the rendezvous's
# TCPStore with the workers and keep it for the life of the job; the workers' process group
# keys are not prefixed by the restart, so a restarted incarnation can read the addresses its
# predecessor published and fail to connect ("Gloo connectFullMesh failed ... Connection
# refused"), a race lost two times in three on a 2-core host. Unshared, every rendezvous round
# gets a fresh store, the same on every node.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
ENV_S3_ENDPOINT = "AWS_ENDPOINT_URL_S3"
ENV_REGION = "AWS_REGION"
ENV_ATTEMPT = "TRAINOPS_ATTEMPT"  # attempt number (1-based) set by the launcher
ENV_CACHE_DIR = "TRAINOPS_CACHE_DIR"  # node-local scratch: downloaded shards, checkpoint staging
# GPUs each node of the job was given (``gpus_per_node``; 0 or unset: none asked for). A trainer
# that sees fewer than its node's ranks need fails before training, as the node's fault.
ENV_GPUS_PER_NODE = "TRAINOPS_GPUS_PER_NODE"
# The spot notice watcher (``trainer.runtime.notice``): off, auto, aws, gce or azure (unset: off),
# and the metadata endpoint's base URL (unset: the provider's own; tests run a fake one).
ENV_SPOT_NOTICE = "TRAINOPS_SPOT_NOTICE"
# The Kubernetes Node a pod runs on (the downward API's spec.nodeName): a notice names it, so the
# next attempt keeps off the node that is going away.
ENV_NODE_NAME = "TRAINOPS_NODE_NAME"
ENV_METADATA_URL = "TRAINOPS_METADATA_URL"
# torchrun's own: how many times the node's agent restarted its workers in place (0: the first
# incarnation of the attempt). A restarted worker reads what the one before it recorded.
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
# torchrun's too: its ``--max-restarts`` (0 or unset: no restart in place can happen). A node's
# agent restarted for another node's sake (a membership change) does not count the restart, so
# the count alone cannot tell a restarted worker: the attempt's record and heartbeat can.
ENV_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
