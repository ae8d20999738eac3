"""An evaluation pod sized from the model it loads."""

import pytest

from trainer.presets import PRESETS, param_count
from trainops.operators.eval_sizing import eval_pod
from trainops.operators.sizing import GIB


def quantity_bytes(text: str) -> int:
    assert text.endswith("Gi"), text
    return int(text[:-2]) * GIB


@pytest.mark.parametrize(("preset", "at_least_gib"), [("1b", 8.1), ("7b", 39.2)])
def test_the_pod_holds_the_model_in_fp32_and_the_weights_being_read(preset, at_least_gib):
    params = param_count(PRESETS[preset].with_vocab(32000))
    pod = eval_pod(params, gpus=0, checkpoint=False)
    needed = params * (4 + 2) + 2 * GIB  # the fp32 model, the bf16 weights read, the process
    assert needed / GIB > at_least_gib  # 1b: 6.2 GiB of model; 7b: 37.7 GiB
    memory = quantity_bytes(pod.options()["memory"])
    assert needed * 1.25 <= memory < needed * 1.25 + GIB  # the margin, rounded up to a GiB
    assert "memory" in pod.describe() and f"{params:,} parameters x 6 bytes" in pod.describe()


def test_a_checkpoint_is_downloaded_whole_an_export_one_file_at_a_time():
    params = param_count(PRESETS["1b"].with_vocab(32000))
    mid_run = eval_pod(params, gpus=1, checkpoint=True).options()
    final = eval_pod(params, gpus=1, checkpoint=False).options()
    assert quantity_bytes(mid_run["cache_size"]) >= params * 12  # weights and AdamW's moments
    assert quantity_bytes(final["cache_size"]) <= 5 * GIB + 2 * GIB  # one 5 GiB file and the margin
    assert quantity_bytes(mid_run["ephemeral_storage"]) > quantity_bytes(mid_run["cache_size"])
    assert (mid_run["cpu"], eval_pod(params, gpus=0, checkpoint=True).options()["cpu"]) == ("3", "2")


def test_a_small_model_gets_the_floor_and_an_unknown_one_is_not_sized():
    assert eval_pod(1000, gpus=0, checkpoint=False).options()["memory"] == "4Gi"
    assert eval_pod(None, gpus=0, checkpoint=False) is None
