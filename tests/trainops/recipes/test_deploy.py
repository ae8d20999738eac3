"""What the example deploy DAG does with the events of a model's production Asset."""

import pytest

from trainer.contract import join, model_version_prefix
from trainer.storage import open_storage
from trainops.recipes.deploy import DeployError, record_release, releases


def extra(model, version, action="promote", root="file:///r"):
    return {
        "action": action,
        "model": model,
        "version": version,
        "uri": model_version_prefix(root, model, version),
    }


def test_the_newest_move_of_each_model_is_what_production_is_now():
    moves = [extra("demo-lm", 2), extra("retrain-lm", 5), extra("demo-lm", 1, "rollback")]
    assert releases(moves) == [extra("demo-lm", 1, "rollback"), extra("retrain-lm", 5)]
    with pytest.raises(DeployError, match=r"lacks \['version', 'uri'\] .*emit it with PromoteModelOperator"):
        releases([{"action": "promote", "model": "demo-lm"}])


def test_what_production_is_now_is_deployed_whatever_the_event_said(file_root):
    from tests.trainops.operators.test_rollback import promote_runs
    from trainops.registry.rollback import rollback

    store = open_storage(file_root)
    with pytest.raises(DeployError, match="demo-lm has no production version"):
        record_release(store, file_root, extra("demo-lm", 1, root=file_root))
    promote_runs(file_root, 2)
    rollback(store, file_root, "demo-lm", 1, reason="v2 regressed", by="alice")  # no event, as from a shell
    record = record_release(store, file_root, extra("demo-lm", 2, root=file_root))
    assert (record["version"], record["uri"], record["event"]["version"]) == (
        1,
        model_version_prefix(file_root, "demo-lm", 1),
        2,
    )
    assert store.get_json(f"{file_root}/models/demo-lm/deployment.json") == record


def test_a_version_folder_without_its_card_is_not_deployed(file_root):
    from tests.trainops.operators.test_rollback import promote_runs

    promote_runs(file_root, 1)
    store = open_storage(file_root)
    store.delete(join(model_version_prefix(file_root, "demo-lm", 1), "card.json"))  # damaged by hand
    with pytest.raises(DeployError, match=r"holds no card\.json, so no promoted version"):
        record_release(store, file_root, extra("demo-lm", 1, root=file_root))
