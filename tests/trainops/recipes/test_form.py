"""The retraining settings: one schema for the form, the Variable and the run plan."""

from __future__ import annotations

import json

import pytest

from trainops.operators.launch_plan import resolve_trainer_config
from trainops.recipes import form
from trainops.settings import SettingsError


def test_unknown_keys_are_refused_by_the_plan_with_a_suggestion():
    with pytest.raises(form.SettingsError) as err:
        form.check_settings({"max_step": 5, "nodes": 2}, source="retrain_manual conf")
    assert "unknown setting(s) 'max_step' (did you mean 'max_steps'?)" in str(err.value)


def test_unset_settings_keep_their_defaults_and_a_bad_value_is_named():
    settings = form.check_settings({"nodes": 4}, source="test", root="file:///data")
    assert settings["nodes"] == 4 and settings["max_steps"] == 60
    assert settings["dataset_uri"] == "file:///data/raw/demo-text"
    with pytest.raises(form.SettingsError, match=r"test: capacity='cheapest' is invalid"):
        form.check_settings({"capacity": "cheapest"}, source="test")


@pytest.mark.parametrize(
    "uri, name",
    [
        ("file:///data/raw/demo-text", "demo-text"),
        ("file:///data/raw/demo-text/", "demo-text"),
        ("s3://raw/tickets/2026-*/*.parquet", "tickets"),
        ("s3://lake/exports/support tickets.jsonl", "support_tickets"),
    ],
)
def test_the_dataset_is_named_after_the_raw_data(uri, name):
    assert form.dataset_name_for(uri) == name


def test_a_glob_right_after_the_bucket_cannot_name_a_dataset():
    with pytest.raises(form.SettingsError, match="cannot name a dataset"):
        form.dataset_name_for("s3://raw/*.parquet")


@pytest.mark.parametrize("preset", form.SETTINGS["model_preset"]["schema"]["enum"])
@pytest.mark.parametrize("max_steps", [1, 60, 100_000])
def test_every_form_choice_makes_a_config_the_trainer_accepts(preset, max_steps):
    config = form.trainer_config(preset, 0.003, max_steps)
    resolve_trainer_config({"run_uri": "file:///r", "data_uri": "file:///d", **config}, 8)


def test_the_plan_says_what_to_stage_and_what_to_train_with():
    settings = form.check_settings(
        {"dataset_uri": "s3://raw/tickets/2026-*/*.parquet", "nodes": 2, "max_steps": 400, "dry_run": True},
        source="test",
    )
    plan = form.plan_run(settings)
    assert (plan["dataset_uri"], plan["dataset_name"], plan["dry_run"]) == (
        "s3://raw/tickets/2026-*/*.parquet",
        "tickets",
        True,
    )
    assert (plan["nodes"], plan["gpus_per_node"], plan["capacity"], plan["max_preemptions"]) == (
        2,
        0,
        "spot",
        3,
    )
    train = plan["trainer_config"]["train"]
    assert (train["max_steps"], train["warmup_steps"]) == (400, 40)
    assert plan["trainer_config"]["checkpoint"]["every_steps"] == 100  # a quarter of the run
    assert json.loads(json.dumps(plan)) == plan  # it travels through XCom


def test_the_form_has_one_param_per_setting_with_its_schema():
    params = form.manual_params(root="file:///data")
    assert set(params) == set(form.SETTINGS)
    assert params["dataset_uri"].value == "file:///data/raw/demo-text"
    assert params["capacity"].schema["enum"] == ["spot", "on-demand", "spot-then-on-demand"]


def test_the_variable_is_checked_like_the_form(monkeypatch):
    allowed = [k for k in form.SETTINGS if k != "dry_run"]
    monkeypatch.delenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", raising=False)
    assert form.variable_settings(allowed=allowed)["nodes"] == 1
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", json.dumps({"nodes": 3}))
    assert form.variable_settings(allowed=allowed)["nodes"] == 3
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", json.dumps([1, 2]))
    with pytest.raises(form.SettingsError, match="expected a JSON object of settings, got"):
        form.variable_settings(allowed=allowed)
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", json.dumps({"dry_run": True}))
    with pytest.raises(form.SettingsError, match=r"Variable trainops_retrain: unknown setting.*'dry_run'"):
        form.variable_settings(allowed=allowed)


@pytest.mark.parametrize(
    "warm", ["auto", "none", "production", "s3://models/retrain-lm/versions/3/", "file:///runs/r/export"]
)
def test_every_warm_start_the_form_accepts_is_an_init_from_the_trainer_accepts(warm):
    settings = form.check_settings({"warm_start": warm}, source="test")
    config = form.plan_run(settings)["trainer_config"]
    assert config["init"] == {"from": warm}
    resolve_trainer_config({"run_uri": "file:///r", "data_uri": "file:///d", **config}, 1)


@pytest.mark.parametrize("warm", ["latest", "s3://", "file://relative", "https://hf.co/m", "none "])
def test_a_warm_start_the_trainer_would_refuse_is_refused_by_the_form(warm):
    with pytest.raises(form.SettingsError, match=r"test: warm_start=.* is invalid"):
        form.check_settings({"warm_start": warm}, source="test")


def test_unattended_runs_default_to_auto():
    assert form.defaults()["warm_start"] == "auto"


def test_a_hugging_face_model_replaces_the_preset_and_warm_starts_from_its_production():
    settings = form.check_settings({"hf_model": "s3://team-models/qwen2-0.5b/"}, source="test")
    config = form.plan_run(settings)["trainer_config"]
    # auto: the operator resolves it to the production version of the model once there is one
    assert (config["model"], config["init"]) == ({"hf": "s3://team-models/qwen2-0.5b/"}, {"from": "auto"})
    resolve_trainer_config({"run_uri": "file:///r", "data_uri": "file:///d", **config}, 1)
    cold = form.check_settings({"hf_model": "s3://m/q/", "warm_start": "none"}, source="test")
    assert form.plan_run(cold)["trainer_config"]["init"] == {"from": "none"}  # the folder's own weights


def test_the_task_reaches_staging_and_the_trainer_and_a_model_folder_tokenizes_the_data():
    preset = form.plan_run(form.check_settings(None, source="test"))
    assert (preset["task"], preset["tokenizer"]) == ("causal_lm", None)  # the presets' byte tokenizer
    assert preset["trainer_config"]["task"] == {"kind": "causal_lm"}
    chat = form.plan_run(form.check_settings({"task": "sft", "hf_model": "s3://m/qwen2/"}, source="test"))
    assert (chat["task"], chat["tokenizer"]) == ("sft", "s3://m/qwen2/tokenizer.json")
    assert chat["trainer_config"]["task"] == {"kind": "sft"}
    resolve_trainer_config({"run_uri": "file:///r", "data_uri": "file:///d", **chat["trainer_config"]}, 1)
    labels = form.plan_run(
        form.check_settings({"task": "classification", "hf_model": "s3://m/bert/"}, source="t")
    )
    assert (labels["task"], labels["trainer_config"]["model"]) == ("classification", {"hf": "s3://m/bert/"})
    with pytest.raises(
        SettingsError,
        match=r"test: task='classification' trains a Hugging Face BERT or RoBERTa classifier, but hf_model is empty",
    ):
        form.check_settings({"task": "classification"}, source="test")
    with pytest.raises(SettingsError, match=r"test: task='translation' is invalid"):
        form.check_settings({"task": "translation"}, source="test")
