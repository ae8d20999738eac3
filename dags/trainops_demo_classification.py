"""trainops_demo_classification: a Hugging Face text classifier, end to end on the embedded default.

Generate labelled data and its tokenizer -> stage it for `classification` (each text one sample,
its label's index recorded, the label set taken from the data) with that tokenizer -> train a
small random-weight BERT (`model.hf_config`, built by transformers as a sequence classifier) on
2 local "nodes" with one injected spot preemption -> evaluate (loss, accuracy, macro F1) ->
gate on what a classifier's team measures (accuracy at least `min_accuracy`; macro F1 no worse
than production's by more than 2 %) -> promote. The promoted version is a Hugging Face folder (`BertForSequenceClassification`
with the labels as its `id2label`, and its tokenizer) that `transformers` loads as is.
`python -m trainops demo --task classification` runs it with `dag.test()`.

The task: each text is a post of the demo text; its label is the source that wrote it (news,
forum or docs). Params: `seed` (the trainer's seed), `min_accuracy` (the gate's threshold, 0.9)
and `preempt`.
"""

from __future__ import annotations

from airflow.sdk import task

from trainer.contract import join
from trainops.operators import StageDatasetOperator
from trainops.recipes.demo import classifier_checks, demo_chain, demo_dag, demo_params, min_accuracy_param
from trainops.settings import resolve_storage_root
from trainops.staging.demo_classification import (
    TOKENIZER_VOCAB,
    write_demo_classification_dataset,
    write_demo_classifier_tokenizer,
)

MODEL = "demo-classifier"
# Where the demo writes its tokenizer; staging encodes with it and the export ships it.
TOKENIZER = join(resolve_storage_root(None), "tokenizers", "demo-classifier", "tokenizer.json")
# A small BERT, random initial weights, the tokenizer's vocabulary ([PAD] is id 0). The labels
# are the dataset's: the trainer pins them into the config (id2label) before building it.
BERT = {
    "model_type": "bert",
    "vocab_size": TOKENIZER_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}

with demo_dag(
    "trainops_demo_classification", __doc__, demo_params(min_accuracy=min_accuracy_param(0.9))
) as dag:

    @task
    def demo_data() -> str:
        """Write the demo tokenizer (once) and the labelled data; return the data's URI."""
        write_demo_classifier_tokenizer(TOKENIZER)
        uri = join(resolve_storage_root(None), "raw", "demo-labelled")
        write_demo_classification_dataset(uri, rows=2000, seed=0)
        return uri

    stage = StageDatasetOperator(
        task_id="stage",
        source_uri=demo_data(),
        dataset_name="demo-labelled",
        task="classification",
        tokenizer=TOKENIZER,
        slice_columns=("length",),  # the evaluation and the card report accuracy by post length
    )

    demo_chain(
        stage,
        model=MODEL,
        trainer_config={
            "seed": "{{ params.seed }}",
            "precision": "bf16",
            "task": {"kind": "classification"},
            "model": {"hf_config": BERT},
            "train": {"max_steps": 80, "micro_batch_size": 8, "seq_len": 48, "lr": 3e-3, "warmup_steps": 8},
            "checkpoint": {"every_steps": 20, "keep": 2},
            "metrics": {"flush_every": 1},
        },
        checks=classifier_checks(),
        preempt_at=40,
    )

if __name__ == "__main__":
    dag.test()
