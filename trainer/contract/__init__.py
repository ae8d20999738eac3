"""The run contract: the whole coupling between the Airflow side and the trainer.

Standard library only. Both halves import this package, and the Airflow side imports it as
``trainer.contract`` (every name below): the plugin to build command lines, layouts and to read
attempt records; the trainer to honour them. Its parts, in order:

1. Command line (``launch``): ``python -m trainer {train,evaluate,export} --config URI [k=v ...]``,
   under torchrun for ``train``. Always an argument list, never a shell string.
2. Environment set by the launcher (``launch``: torchrun's own, plus the names there).
3. Storage layout under a root URI, ``file://`` or ``s3://`` (``layout``: names to folders,
   :class:`RunLayout`, the metrics parts' names, a dataset version's manifest).
4. Attempt records (``records``): ``attempts/<n>.json``, the trainer's own account of attempt n.
5. Metrics (``metrics``): one record per step, each with its attempt, in immutable parts
   ``metrics/part-<attempt>-<n>.jsonl`` (the previous version's ``metrics.jsonl`` is still
   read); the one reader is there, :class:`MetricsReader`.
6. Heartbeats (``heartbeat``): ``heartbeat/<n>.json``, attempt n's latest step, for hang detection.
7. Tasks (``tasks``): what a staged dataset's samples are (token windows; prompt/response
   records whose response alone is scored), and where a record task's records are listed.
"""

from trainer.contract.heartbeat import (
    Heartbeat,
    parse_heartbeat,
)
from trainer.contract.launch import (
    ENV_ATTEMPT,
    ENV_CACHE_DIR,
    ENV_GPUS_PER_NODE,
    ENV_REGION,
    ENV_S3_ENDPOINT,
    TRAINER_COMMANDS,
    torchrun_argv,
    trainer_argv,
)
from trainer.contract.layout import (
    ATTEMPT_DIR_PREFIX,
    HASH_MARK,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MAX_HELD_FOR_EVAL,
    MAX_NAME,
    MAX_SEGMENT,
    METRICS_DIR,
    SPLITS,
    RunLayout,
    attempt_of_files_dir,
    check_name,
    checkpoint_step_of,
    dataset_prefix,
    join,
    legacy_segment,
    metrics_part_key,
    metrics_part_name,
    metrics_run_uri,
    model_prefix,
    model_version_prefix,
    production_pointer,
    prune_plan,
    run_prefix,
    safe_segment,
    scheduled_for_eval,
)
from trainer.contract.metrics import (
    MetricsReader,
    MetricsRecord,
    MetricsStorage,
    MetricsTooLarge,
    last_record,
    latest_of_attempt,
    max_step_of_attempt,
    merge_metrics,
    metrics_by_step,
    metrics_records,
)
from trainer.contract.records import (
    ATTEMPT_FORMAT,
    ATTEMPT_LINE_MARK,
    CAUSES,
    EARLY_ATTEMPT_LINE_MARK,
    OUTCOMES,
    AttemptRecord,
    Cause,
    Outcome,
    attempt_record,
    attempt_record_in_log,
    attempt_record_line,
    parse_attempt_record,
)
from trainer.contract.tasks import (
    BUILTIN_METRICS,
    CHAT_TEMPLATE_FILE,
    EVAL_REPORT_KEYS,
    IGNORE_INDEX,
    METRIC_NAME,
    RECORD_FIELDS,
    RECORD_TASKS,
    RECORDS_DTYPE,
    SLICE_TABLE_KEYS,
    TASK_CAUSAL_LM,
    TASK_CLASSIFICATION,
    TASK_KINDS,
    TASK_SFT,
    TOKENIZER_CONFIG_FILE,
    chat_template_text,
    dataset_labels,
    dataset_task,
    metric_name_problem,
    split_records,
    task_labels,
)

CONTRACT_VERSION = 1

# The trainer modules the Airflow side may import (each with its submodules: this package's
# parts, trainer.storage's backends): they import neither torch nor Airflow (standard library,
# PyYAML, boto3 inside the S3 client). Nothing else of the trainer may reach a scheduler, worker
# or triggerer; tests/test_boundaries.py holds both halves to it.
SHARED_MODULES = ("trainer.contract", "trainer.storage", "trainer.config", "trainer.presets", "trainer.flops")

__all__ = [
    "ATTEMPT_DIR_PREFIX",
    "ATTEMPT_FORMAT",
    "ATTEMPT_LINE_MARK",
    "BUILTIN_METRICS",
    "CAUSES",
    "CHAT_TEMPLATE_FILE",
    "CONTRACT_VERSION",
    "EARLY_ATTEMPT_LINE_MARK",
    "ENV_ATTEMPT",
    "ENV_CACHE_DIR",
    "ENV_GPUS_PER_NODE",
    "ENV_REGION",
    "ENV_S3_ENDPOINT",
    "EVAL_REPORT_KEYS",
    "HASH_MARK",
    "IGNORE_INDEX",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MAX_HELD_FOR_EVAL",
    "MAX_NAME",
    "MAX_SEGMENT",
    "METRICS_DIR",
    "METRIC_NAME",
    "OUTCOMES",
    "RECORDS_DTYPE",
    "RECORD_FIELDS",
    "RECORD_TASKS",
    "SHARED_MODULES",
    "SLICE_TABLE_KEYS",
    "SPLITS",
    "TASK_CAUSAL_LM",
    "TASK_CLASSIFICATION",
    "TASK_KINDS",
    "TASK_SFT",
    "TOKENIZER_CONFIG_FILE",
    "TRAINER_COMMANDS",
    "AttemptRecord",
    "Cause",
    "Heartbeat",
    "MetricsReader",
    "MetricsRecord",
    "MetricsStorage",
    "MetricsTooLarge",
    "Outcome",
    "RunLayout",
    "attempt_of_files_dir",
    "attempt_record",
    "attempt_record_in_log",
    "attempt_record_line",
    "chat_template_text",
    "check_name",
    "checkpoint_step_of",
    "dataset_labels",
    "dataset_prefix",
    "dataset_task",
    "join",
    "last_record",
    "latest_of_attempt",
    "legacy_segment",
    "max_step_of_attempt",
    "merge_metrics",
    "metric_name_problem",
    "metrics_by_step",
    "metrics_part_key",
    "metrics_part_name",
    "metrics_records",
    "metrics_run_uri",
    "model_prefix",
    "model_version_prefix",
    "parse_attempt_record",
    "parse_heartbeat",
    "production_pointer",
    "prune_plan",
    "run_prefix",
    "safe_segment",
    "scheduled_for_eval",
    "split_records",
    "task_labels",
    "torchrun_argv",
    "trainer_argv",
]
