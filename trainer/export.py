"""Export: consolidated fp32 weights (safetensors) + the model config, under ``<run_uri>/export``.

Written at the end of ``train`` (rank 0, from the gathered full state dict) and by the
``export`` command (a single process, from the newest valid checkpoint). Both give the
same bytes for the same checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

from trainer.contract import RunLayout, join
from trainer.data import cache_dir
from trainer.presets import ModelArgs, param_count

log = logging.getLogger("trainer.export")

WEIGHTS = "model.safetensors"
MODEL_CONFIG = "model_config.json"
INFO = "export.json"


def write_export(storage, export_uri: str, state_dict: dict, args: ModelArgs, *, step: int,
                 data_uri: str, run_uri: str, precision: str) -> dict:
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in state_dict.items()}
    info = {"step": int(step), "data_uri": data_uri, "run_uri": run_uri, "precision": precision,
            "param_count": param_count(args)}
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        path = f"{tmp}/{WEIGHTS}"
        save_file(tensors, path)
        storage.upload_file(path, join(export_uri, WEIGHTS))
    storage.put_json(join(export_uri, MODEL_CONFIG), args.to_dict())
    storage.put_json(join(export_uri, INFO), info)
    log.info("export: step %d, %s parameters, written to %s", step, f"{info['param_count']:,}", export_uri)
    return info


def load_export(storage, export_uri: str):
    """The model in an export folder, as a plain fp32 ``Transformer`` in eval mode."""
    from trainer.model import Transformer

    args = ModelArgs.from_dict(storage.get_json(join(export_uri, MODEL_CONFIG)))
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        path = f"{tmp}/{WEIGHTS}"
        storage.download_file(join(export_uri, WEIGHTS), path)
        tensors = load_file(path)
    model = Transformer(args)
    model.load_state_dict(tensors)
    return model.eval(), args


def export_from_checkpoint(config) -> dict:
    """The ``export`` command: newest valid checkpoint of ``config.run_uri`` -> ``<run_uri>/export``."""
    from trainer.checkpoint import Checkpointer, load_model_weights
    from trainer.model import Transformer
    from trainer.storage import open_storage

    storage = open_storage(config.run_uri)
    checkpointer = Checkpointer(storage, config.run_uri, rank=0, world_size=1, keep=config.checkpoint.keep)
    step, marker = checkpointer.find_latest()
    if step is None:
        raise RuntimeError(f"no committed checkpoint under {RunLayout(config.run_uri).checkpoints}; "
                           f"run `trainer train` first or check run_uri")
    args = ModelArgs.from_dict(marker["model"])
    model = Transformer(args)
    local = checkpointer.download(step, marker)
    try:
        load_model_weights(local, model)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return write_export(storage, RunLayout(config.run_uri).export, model.state_dict(), args, step=step,
                        data_uri=marker.get("data_uri", config.data_uri), run_uri=config.run_uri,
                        precision=marker.get("precision", config.precision))
