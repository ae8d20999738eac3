"""The demos' shared chain: two local CPU nodes, one injected preemption, a gate on the loss
or, for the classifier, on accuracy and macro-F1."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from trainops.gate.checks import validate_checks
from trainops.operators import StageDatasetOperator
from trainops.recipes.demo import classifier_checks, demo_chain, loss_checks, preempt_param


def test_the_chain_trains_on_two_nodes_through_one_preemption_and_gates_on_the_param():
    with DAG(
        "d",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        render_template_as_native_obj=True,  # as the demos render it
        params={"preempt": preempt_param()},
    ) as dag:
        stage = StageDatasetOperator(task_id="stage", source_uri="file:///raw", dataset_name="demo")
        tasks = demo_chain(
            stage,
            model="demo-x",
            trainer_config={"train": {"max_steps": 9}},
            checks=loss_checks("loss ok"),
            preempt_at=4,
        )
    assert set(tasks) == {"train", "evaluate", "gate", "promote"} <= set(dag.task_ids)
    train = tasks["train"]
    assert (train.nodes, train.gpus_per_node) == (2, 0)
    # The preemption follows the DAG's preempt param (on by default): rendered, a mapping or None.
    env = dag.get_template_env()
    for preempt, injected in ((True, {"node": 1, "at_step": 4}), (False, None)):
        rendered = train.render_template(train.inject_preemption, {"params": {"preempt": preempt}}, env)
        assert rendered == injected
    assert dag.params["preempt"] is True
    assert train.trainer_config == {"train": {"max_steps": 9}}
    checks = tasks["gate"].checks
    assert [c["name"] for c in checks] == ["loss ok", "no regression vs production"]
    assert checks[0]["value"] == "{{ params.max_eval_loss }}"  # the DAG's param, rendered at run time
    validate_checks([{**checks[0], "value": 1.0}, checks[1]])
    assert tasks["evaluate"].model_name == tasks["promote"].model_name == "demo-x"
    assert tasks["train"].downstream_task_ids == {"evaluate", "promote"}


def test_the_classifiers_gate_checks_accuracy_against_its_param_and_macro_f1_against_production():
    checks = validate_checks(classifier_checks(), templates="allow")
    assert [(c["kind"], c["metric"]) for c in checks] == [
        ("threshold", "accuracy"),
        ("no_regression", "f1_macro"),
    ]
    assert checks[0]["value"] == "{{ params.min_accuracy }}" and checks[1]["direction"] == "higher_is_better"
    rendered = validate_checks([{**checks[0], "value": "0.9"}, checks[1]], templates="rendered")
    assert rendered[0]["value"] == 0.9
