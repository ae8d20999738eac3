"""trainops_demo_sft: instruction tuning of a Hugging Face model, end to end on the embedded default.

Generate prompt/response data and its tokenizer -> stage it for `sft` (each record one sample,
the loss on the response only) with that tokenizer -> train a small random-weight Qwen2
(`model.hf_config`, built by transformers) on 2 local "nodes" with one injected spot
preemption -> evaluate on the eval records' responses -> gate -> promote. The promoted version
is a Hugging Face folder (`Qwen2ForCausalLM`, its tokenizer) that `transformers` loads as is.
`python -m trainops demo --task sft` runs it with `dag.test()`.

The task: each prompt is a post of the demo text and `source:`; the response is the source
that wrote it (news, forum or docs). Params: `seed` (the trainer's seed) and `max_eval_loss`
(the gate's threshold on the responses' loss).
"""

from __future__ import annotations

from airflow.sdk import task

from trainer.contract import join
from trainops.operators import StageDatasetOperator
from trainops.recipes.demo import demo_chain, demo_dag, demo_params, loss_checks, max_eval_loss_param
from trainops.settings import resolve_storage_root
from trainops.staging.demo_sft import TOKENIZER_VOCAB, write_demo_sft_dataset, write_demo_tokenizer

MODEL = "demo-sft"
# Where the demo writes its tokenizer; staging encodes with it and the export ships it.
TOKENIZER = join(resolve_storage_root(None), "tokenizers", "demo-chat", "tokenizer.json")
# A small Qwen2 (tied embeddings, as Qwen2-0.5B), random initial weights, the tokenizer's vocabulary.
QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": TOKENIZER_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}

with demo_dag(
    "trainops_demo_sft",
    __doc__,
    demo_params(max_eval_loss=max_eval_loss_param(1.0, "loss on the eval responses")),
) as dag:

    @task
    def demo_data() -> str:
        """Write the demo tokenizer (once) and the prompt/response data; return the data's URI."""
        write_demo_tokenizer(TOKENIZER)
        uri = join(resolve_storage_root(None), "raw", "demo-instructions")
        write_demo_sft_dataset(uri, rows=2000, seed=0)
        return uri

    stage = StageDatasetOperator(
        task_id="stage",
        source_uri=demo_data(),
        dataset_name="demo-instructions",
        task="sft",
        tokenizer=TOKENIZER,
        slice_columns=("source",),
    )

    demo_chain(
        stage,
        model=MODEL,
        trainer_config={
            "seed": "{{ params.seed }}",
            "precision": "bf16",
            "task": {"kind": "sft"},
            "model": {"hf_config": QWEN2},
            "train": {"max_steps": 100, "micro_batch_size": 8, "seq_len": 48, "lr": 3e-3, "warmup_steps": 10},
            "checkpoint": {"every_steps": 25, "keep": 2},
            "metrics": {"flush_every": 1},
        },
        checks=loss_checks("response loss under max_eval_loss"),
        preempt_at=40,
    )

if __name__ == "__main__":
    dag.test()
