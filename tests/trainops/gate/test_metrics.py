"""Which metrics an evaluation reports, which way each is better, and which a page shows."""

from trainer.contract import TASK_KINDS
from trainops.gate.metrics import BUILTIN, HIGHER, LOWER, better, known_metrics, shown_metrics


def test_every_task_has_a_metric_and_each_metric_a_direction():
    assert {task for m in BUILTIN.values() for task in m.tasks} == set(TASK_KINDS)
    assert {m.name: m.direction for m in BUILTIN.values()} == {
        "accuracy": HIGHER,
        "f1_macro": HIGHER,
        "auroc": HIGHER,
        "calibration_error": LOWER,
        "exact_match": HIGHER,
        "token_f1": HIGHER,
        "eval_loss": LOWER,
        "perplexity": LOWER,
    }
    assert "f1_macro (higher is better; classification)" in known_metrics()


def test_a_page_shows_the_tasks_own_metrics_first_and_only_those_held():
    classifier = {"eval_loss": 0.2, "accuracy": 0.9, "f1_macro": 0.8, "records": 200, "tokens": 900}
    assert [m.name for m in shown_metrics(classifier)] == ["accuracy", "f1_macro", "eval_loss"]
    language_model = {"eval_loss": 2.0, "perplexity": 7.4, "tokens": 900}
    assert [m.name for m in shown_metrics(language_model, None)] == ["eval_loss", "perplexity"]
    tuned = {**language_model, "exact_match": 0.5, "token_f1": 0.7, "answers": 20}
    assert [m.name for m in shown_metrics(tuned)][:2] == ["exact_match", "token_f1"]
    # production scored before the classifier metrics existed: the candidate's still show
    assert [m.name for m in shown_metrics({"eval_loss": 0.1}, classifier)][:2] == ["accuracy", "f1_macro"]


def test_better_reads_the_metrics_direction():
    assert better(BUILTIN["accuracy"], 0.9, 0.8) and not better(BUILTIN["accuracy"], 0.7, 0.8)
    assert better(BUILTIN["eval_loss"], 0.7, 0.8) and not better(BUILTIN["eval_loss"], 0.9, 0.8)


def test_the_trainers_report_and_the_gates_table_list_one_set_of_metrics():
    from trainer.contract import BUILTIN_METRICS

    assert tuple(BUILTIN) == BUILTIN_METRICS


def test_a_teams_own_metrics_show_after_the_built_in_ones_without_a_direction():
    from trainops.gate.metrics import missing_metric_hint, user_metric_problem

    scores = {
        "accuracy": 0.9,
        "worst_label_recall": 0.7,
        "user_metrics": {"worst_label_recall": "team_metrics:worst_label_recall", "tokens": "x:y"},
    }
    shown = shown_metrics(scores, {"accuracy": 0.8})
    assert [(m.name, m.direction) for m in shown] == [("accuracy", HIGHER), ("worst_label_recall", "")]
    assert better(shown[1], 0.7, 0.8) is None  # a page cannot say better or worse without one
    assert user_metric_problem("worst_label_recall") is None
    for taken in ("accuracy", "tokens", "slice", "production_recall", "recall_ratio"):
        assert user_metric_problem(taken) == f"{taken!r} is a name the evaluation or the gate uses itself"
    assert "a metric name is a letter" in user_metric_problem("recall\n")
    assert "a metric name is a letter" in user_metric_problem("2nd")
    assert missing_metric_hint("keyword_recall", scores) == (
        "keyword_recall is not a built-in metric, and no scorer of this evaluation returned it "
        "(EvaluateModelOperator's metrics, the trainer's eval.metrics); this evaluation holds "
        "accuracy, worst_label_recall"
    )
