"""``python -m trainops demo --task sft`` (the ``trainops_demo_sft`` DAG) through Airflow's own
``dag.test()``: prompt/response data staged for ``sft`` with the demo's own tokenizer, a small
random Qwen2 trained on 2 local nodes through one injected preemption, evaluated on the eval
responses, gated and promoted; the promoted folder loads with ``transformers`` alone, with the
trainer's logits, and answers its prompts asked through its own chat template (ChatML), ending
its turn with ``<|im_end|>`` as an instruction-tuned model does."""

from __future__ import annotations

import os
from hashlib import sha256

import pytest
import torch

from tests.trainops.reports.helpers import page_text
from trainer.contract import MetricsReader, RunLayout, production_pointer
from trainer.storage import open_storage
from trainops.cli.main import DEMO_TASKS, DEMOS, load_dag, xcom_results
from trainops.reports.card_page import render_card_page
from trainops.staging.demo_sft import CHAT_TEMPLATE, TURN_END

pytestmark = pytest.mark.slow


def test_the_sft_demo_tunes_a_qwen2_on_its_responses_and_promotes_a_folder_transformers_serves(
    tmp_path, airflow_db, monkeypatch
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.export.folder import load_model

    dag_id, model = DEMOS["sft"]
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], dag_id)  # parsed under this root
    dagrun = dag.test()
    results = xcom_results(dag_id, dagrun.run_id, DEMO_TASKS)
    assert str(dagrun.state).rsplit(".", 1)[-1].lower() == "success", results
    store = open_storage(root)

    stage = results["stage"]
    manifest = store.get_json(f"{stage['uri']}/manifest.json")
    assert manifest["task"] == {"kind": "sft"} and manifest["tokenizer"]["kind"] == "huggingface"
    assert manifest["tokenizer"]["chat_template_sha256"] == sha256(CHAT_TEMPLATE.encode()).hexdigest()
    train = results["train"]
    assert (train["preemptions"], train["steps_lost"], train["steps"]) == (1, 0, 100)
    layout = RunLayout(train["run_uri"])
    records = [store.get_json(layout.attempt(n)) for n in (1, 2)]
    assert [r["outcome"] for r in records] == ["preempted", "completed"]
    assert records[1]["resumed_from_step"] == records[0]["checkpoint_step"] == records[0]["last_step"]
    assert {r["step"] for r in MetricsReader(store, layout.run_uri).records()} == set(range(1, 101))
    evaluation = store.get_json(layout.eval_metrics)["candidate"]
    assert evaluation["eval_loss"] < 0.5 and results["gate"]["approved"] is True  # ln(512) = 6.2 untrained
    # Its greedy answers to the eval prompts, scored against the references, headline its card.
    assert evaluation["answers"] > 150 and evaluation["exact_match"] > 0.9 and evaluation["token_f1"] > 0.9
    pointer = store.get_json(production_pointer(root, model))
    assert pointer["version"] == results["promote"]["version"] == 1
    card_uri = f"{pointer['uri']}/card.json"
    headline = page_text(render_card_page(card_uri, store.get(card_uri)))
    headline = headline[: headline.index("Gate checks")]
    assert f"Exact match {evaluation['exact_match']:.4g} no production model" in headline
    assert "Token F1 " in headline

    folder = pointer["uri"]
    path = folder.removeprefix("file://")
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # transformers alone
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(theirs).__name__ == "Qwen2ForCausalLM"
    ours, _ = load_model(open_storage(folder), folder)
    prompts = {
        "news": "the council opened a new bridge in oslo on monday.\nsource:",
        "docs": "edit config.yaml before you restart the server.\nsource:",
    }
    # Asked as a chat model is asked: the folder's own template, and generation ends with the turn.
    end_of_turn = tokenizer.convert_tokens_to_ids(TURN_END)
    assert tokenizer.eos_token == TURN_END and theirs.generation_config.eos_token_id[0] == end_of_turn
    for source, prompt in prompts.items():
        chat = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            assert (ours(ids) - theirs(input_ids=ids).logits).abs().max().item() <= 1e-5
            answer = theirs.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
        assert tokenizer.decode(answer, skip_special_tokens=True).strip() == source
        assert answer[-1].item() == end_of_turn and len(answer) < 8  # it ended its turn, not the budget
