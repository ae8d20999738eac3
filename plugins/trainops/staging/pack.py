"""Tokenize record batches into train/eval shards and the eval index, in a local folder.

An ``sft`` source's records are a prompt and a response: each record's tokens are the prompt's
(without the end-of-record token) then the response's (with it), and its split lists it in
``<split>/records.bin`` (``trainer.contract.tasks``: start, length, prompt tokens), so the
trainer takes it as one sample and scores its response only.

A ``classification`` source's records are a text and a label: each record's tokens are its
text's, framed as the tokenizer frames one sequence (``encode_batch(special=True)``), and
``records.bin`` lists it with its label's index. The label set is the data's, sorted; the
packer numbers labels as it meets them and renumbers them in :meth:`Packer.close`, where it
also counts each label's records."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from collections.abc import Iterable, Sequence

from trainer.contract import RECORD_TASKS, RECORDS_DTYPE, TASK_CAUSAL_LM, TASK_CLASSIFICATION, TASK_SFT
from trainops.staging.encoders import ByteTokenizer
from trainops.staging.errors import StagingError
from trainops.staging.manifest import EVAL_INDEX_PATH
from trainops.staging.tokenize import ShardPacker, eval_mask, index_line

SPLITS = ("train", "eval")
SFT_COLUMNS = ("prompt", "response")  # an sft source's text columns
LABEL_COLUMN = "label"  # a classification source's label column (read as strings)


def null_problem(row: int, column: str) -> str:
    """Why row ``row`` cannot be staged: its ``column`` (the id or the text) is null."""
    return (
        f"row {row} has a null {column!r}, which staging cannot split or "
        f"tokenize: add expect_column_values_to_not_be_null for {column!r} to the "
        "expectations, quarantine such rows, or clean the data"
    )


def label_problem(record_id: str, row: int, label: str, labels: list[str]) -> str:
    """Why a record cannot be staged: its label is not in the fixed label set."""
    return (
        f"record {record_id!r} (row {row}) has label {label!r}, which is not in the label set {labels}: "
        "add it to labels (a new label set trains a new classifier head: warm starts from the old one "
        "are refused), quarantine such rows, or fix the data"
    )


def too_long_problem(record_id: str, row: int, tokens: int, shard_tokens: int) -> str:
    """Why a record cannot be staged: it has more tokens than a shard holds."""
    return (
        f"record {record_id!r} (row {row}) has {tokens} tokens, more than "
        f"a shard holds (shard_tokens={shard_tokens}): raise shard_tokens, cap the "
        f"text with expect_column_value_lengths_to_be_between, or quarantine such rows"
    )


class Packer:
    """Splits records by a hash of their id and appends their tokens to the split's shards.

    Rows it cannot stage (a null id or text, a record longer than a shard) are not packed;
    :meth:`add` returns them so the caller can quarantine them, and :attr:`problem` keeps
    the first one as an error message for when there is no quarantine.
    """

    def __init__(
        self,
        out_dir: str,
        tokenizer,
        *,
        eval_percent: int,
        shard_tokens: int,
        slice_columns: Sequence[str] = ("source",),
        id_column: str = "id",
        text_column: str | Sequence[str] = "text",
        task: str = TASK_CAUSAL_LM,
        labels: Sequence[str] | None = None,
    ):
        self.out_dir = out_dir
        self.task = task
        self.records: dict[str, list] = {s: [] for s in SPLITS}  # sft: each batch's record rows
        self.tokenizer = tokenizer
        self.eval_percent = eval_percent
        self.shard_tokens = shard_tokens
        self.slice_columns = list(slice_columns)
        # classification: each label's number, as first met; or the fixed set's, in its order
        self.labels: dict[str, int] = {label: i for i, label in enumerate(labels or ())}
        self.fixed_labels = labels is not None
        if task == TASK_SFT:
            text_column = SFT_COLUMNS[0]  # null checks and messages; the response is read too
        elif not isinstance(text_column, str):
            text_column = text_column[0]
        self.id_column, self.text_column = id_column, text_column
        self.packers = {s: ShardPacker(out_dir, s, shard_tokens, tokenizer.dtype) for s in SPLITS}
        os.makedirs(os.path.join(out_dir, "eval"), exist_ok=True)
        self._index = open(os.path.join(out_dir, EVAL_INDEX_PATH), "w", encoding="utf-8")  # noqa: SIM115 - open across batches; close() ends it
        self.problem: str | None = None

    def add(self, batch, rows) -> dict[int, str]:
        """Pack one batch (``rows``: the rows' numbers in the source); return the rows it
        could not pack, ``{row number: reason}``."""
        import numpy as np
        import pyarrow.compute as pc

        rows = np.asarray(rows)
        if self.task == TASK_SFT:
            return self._add_sft(batch, rows)
        if self.task == TASK_CLASSIFICATION:
            return self._add_labelled(batch, rows)
        ids = batch.column(batch.schema.get_field_index(self.id_column))
        texts = batch.column(batch.schema.get_field_index(self.text_column))
        skipped: dict[int, str] = {}
        null = pc.or_(pc.is_null(ids), pc.is_null(texts)).to_numpy(zero_copy_only=False)
        if null.any():
            for i in np.flatnonzero(null):
                column = self.id_column if ids[int(i)].as_py() is None else self.text_column
                skipped[int(rows[i])] = f"null {column!r}"
                self._first_problem(null_problem(int(rows[i]), column))
            keep = ~null
            batch, rows = batch.filter(keep), rows[keep]
            ids = batch.column(batch.schema.get_field_index(self.id_column))
            texts = batch.column(batch.schema.get_field_index(self.text_column))
        if not batch.num_rows:
            return skipped
        tokens, lengths = self.tokenizer.encode_batch(texts)
        ids = [str(v) for v in ids.to_pylist()]
        too_long = np.flatnonzero(lengths > self.shard_tokens)
        for i in too_long:
            skipped[int(rows[i])] = f"{int(lengths[i])} tokens > shard_tokens {self.shard_tokens}"
            self._first_problem(too_long_problem(ids[i], int(rows[i]), int(lengths[i]), self.shard_tokens))
        self._pack(batch, ids, tokens, lengths, set(too_long.tolist()))
        return skipped

    def _add_sft(self, batch, rows) -> dict[int, str]:
        """An sft batch: the prompt's tokens then the response's, per record; rows with a null id,
        prompt or response, or longer than a shard, are returned as for text."""
        import numpy as np

        batch, rows, skipped = self._without_nulls(batch, rows, [self.id_column, *SFT_COLUMNS])
        if not batch.num_rows:
            return skipped

        def column(name: str):
            return batch.column(batch.schema.get_field_index(name))

        prompt_texts, response_texts = column(SFT_COLUMNS[0]), column(SFT_COLUMNS[1])
        chat = getattr(self.tokenizer, "chat", None)
        if chat is not None:  # the tokenizer's chat template (trainops.staging.chat)
            import pyarrow as pa

            pairs = [
                chat.split(p, r)
                for p, r in zip(prompt_texts.to_pylist(), response_texts.to_pylist(), strict=True)
            ]
            prompt_texts = pa.array([p for p, _ in pairs], pa.large_string())
            response_texts = pa.array([r for _, r in pairs], pa.large_string())
        prompts, prompt_lengths = self.tokenizer.encode_batch(prompt_texts)
        responses, response_lengths = self.tokenizer.encode_batch(response_texts)
        prompt_lengths = prompt_lengths - 1  # the prompt runs on into the response: no end of record
        # A template ends the response with its own end of turn: no end of record after it either.
        ends = 0 if chat is None else 1
        lengths = prompt_lengths + response_lengths - ends
        tokens = np.empty(int(lengths.sum()), dtype=prompts.dtype)
        p_starts = np.cumsum(prompt_lengths + 1) - prompt_lengths - 1
        r_starts = np.cumsum(response_lengths) - response_lengths
        at = 0
        for n in range(len(lengths)):
            p, r = int(prompt_lengths[n]), int(response_lengths[n]) - ends
            tokens[at : at + p] = prompts[p_starts[n] : p_starts[n] + p]
            tokens[at + p : at + p + r] = responses[r_starts[n] : r_starts[n] + r]
            at += p + r
        ids = [str(v) for v in column(self.id_column).to_pylist()]
        too_long = np.flatnonzero(lengths > self.shard_tokens)
        for i in too_long:
            skipped[int(rows[i])] = f"{int(lengths[i])} tokens > shard_tokens {self.shard_tokens}"
            self._first_problem(too_long_problem(ids[i], int(rows[i]), int(lengths[i]), self.shard_tokens))
        self._pack(batch, ids, tokens, lengths, set(too_long.tolist()), prompt_lengths)
        return skipped

    def _without_nulls(self, batch, rows, names: list[str]):
        """``(batch, rows, skipped)``: the rows with a null in any of ``names`` left out, each
        returned as ``{row number: "null '<column>'"}`` (the first also kept as the problem)."""
        import numpy as np
        import pyarrow.compute as pc

        def column(name: str):
            return batch.column(batch.schema.get_field_index(name))

        skipped: dict[int, str] = {}
        null = np.zeros(batch.num_rows, dtype=bool)
        for name in names:
            null |= pc.is_null(column(name)).to_numpy(zero_copy_only=False)
        if null.any():
            for i in np.flatnonzero(null):
                name = next(n for n in names if column(n)[int(i)].as_py() is None)
                skipped[int(rows[i])] = f"null {name!r}"
                self._first_problem(null_problem(int(rows[i]), name))
            batch, rows = batch.filter(~null), rows[~null]
        return batch, rows, skipped

    def _add_labelled(self, batch, rows) -> dict[int, str]:
        """A classification batch: the text's tokens, framed, and the label's number per record;
        rows with a null id, text or label, or longer than a shard, are returned as for text."""
        import numpy as np

        batch, rows, skipped = self._without_nulls(
            batch, rows, [self.id_column, self.text_column, LABEL_COLUMN]
        )
        if not batch.num_rows:
            return skipped

        def column(name: str):
            return batch.column(batch.schema.get_field_index(name))

        ids = [str(v) for v in column(self.id_column).to_pylist()]
        names = [str(v) for v in column(LABEL_COLUMN).to_pylist()]
        if self.fixed_labels:
            outside = np.array([name not in self.labels for name in names], dtype=bool)
            for i in np.flatnonzero(outside):
                skipped[int(rows[i])] = f"label {names[i]!r} not in the label set"
                self._first_problem(label_problem(ids[i], int(rows[i]), names[i], list(self.labels)))
            if outside.any():
                batch, rows = batch.filter(~outside), rows[~outside]
                ids = [i for i, out in zip(ids, outside, strict=True) if not out]
                names = [n for n, out in zip(names, outside, strict=True) if not out]
                if not batch.num_rows:
                    return skipped
        tokens, lengths = self.tokenizer.encode_batch(column(self.text_column), special=True)
        labels = np.array([self.labels.setdefault(name, len(self.labels)) for name in names], dtype=np.int64)
        too_long = np.flatnonzero(lengths > self.shard_tokens)
        for i in too_long:
            skipped[int(rows[i])] = f"{int(lengths[i])} tokens > shard_tokens {self.shard_tokens}"
            self._first_problem(too_long_problem(ids[i], int(rows[i]), int(lengths[i]), self.shard_tokens))
        self._pack(batch, ids, tokens, lengths, set(too_long.tolist()), labels)
        return skipped

    def _pack(self, batch, ids: list[str], tokens, lengths, skip: set[int], prompts=None) -> None:
        import numpy as np

        is_eval = eval_mask(ids, self.eval_percent)
        keep = np.ones(len(ids), dtype=bool)
        if skip:
            keep[list(skip)] = False
        for split, chosen in (("train", keep & ~is_eval), ("eval", keep & is_eval)):
            if not chosen.any():
                continue
            token_mask = np.repeat(chosen, lengths)
            start, _ = self.packers[split].add(
                tokens[token_mask].astype("<u2" if self.tokenizer.dtype == "uint16" else "<u4", copy=False),
                records=int(chosen.sum()),
            )
            if prompts is not None:  # the records' rows, (start, length, prompt tokens or label)
                picked = np.flatnonzero(chosen)
                ends = start + np.cumsum(lengths[picked])
                self.records[split].append(
                    np.stack([ends - lengths[picked], lengths[picked], prompts[picked]], 1)
                )
            if split == "eval":
                self._write_index(batch, ids, lengths, chosen, start)

    def _write_index(self, batch, ids, lengths, chosen, start: int) -> None:
        import numpy as np

        picked = np.flatnonzero(chosen)
        ends = start + np.cumsum(lengths[picked])
        slices = {
            c: batch.column(batch.schema.get_field_index(c)).take(picked).to_pylist()
            for c in self.slice_columns
        }
        lines = []
        for n, i in enumerate(picked):
            values = {c: json_value(slices[c][n]) for c in self.slice_columns}
            end = int(ends[n])
            lines.append(index_line(ids[i], values, end - int(lengths[i]), end))
        self._index.write("".join(lines))

    def _write_records(self, split: str) -> dict:
        """``<split>/records.bin`` and its manifest entry (``trainer.contract.tasks``)."""
        import numpy as np

        rows = self.records[split]
        table = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.int64)
        data = table.astype(RECORDS_DTYPE).tobytes()
        rel = f"{split}/records.bin"
        os.makedirs(os.path.join(self.out_dir, split), exist_ok=True)
        with open(os.path.join(self.out_dir, rel), "wb") as out:
            out.write(data)
        return {"path": rel, "count": len(table), "sha256": hashlib.sha256(data).hexdigest()}

    def _first_problem(self, message: str) -> None:
        if self.problem is None:
            self.problem = message

    def close(self) -> dict:
        """Finish the shards; return ``{"splits", "rows": {"total", "train", "eval"},
        "eval_records", "files"}`` (file paths relative to ``out_dir``)."""
        self._index.close()
        splits = {s: p.close() for s, p in self.packers.items()}
        files = [sh["path"] for s in SPLITS for sh in splits[s]["shards"]]
        labelled = {}
        if self.task == TASK_CLASSIFICATION:
            labelled = self._renumber_labels()
        if self.task in RECORD_TASKS:
            for split in SPLITS:
                splits[split]["records"] = self._write_records(split)
                files.append(splits[split]["records"]["path"])
        train, evals = self.packers["train"].records, self.packers["eval"].records
        return {
            "splits": splits,
            "rows": {"total": train + evals, "train": train, "eval": evals},
            "eval_records": evals,
            "files": [*files, EVAL_INDEX_PATH],
            **labelled,
        }

    def _renumber_labels(self) -> dict:
        """Number the labels in sorted order (the label set's, whatever order the data came
        in; a fixed set keeps its own order); return ``{"labels": [...], "label_counts": {label: {split: records}}}``."""
        import numpy as np

        order = list(self.labels) if self.fixed_labels else sorted(self.labels)
        new = np.zeros(max(len(self.labels), 1), dtype=np.int64)
        for label, number in self.labels.items():
            new[number] = order.index(label)
        counts = {label: dict.fromkeys(SPLITS, 0) for label in order}
        for split in SPLITS:
            for table in self.records[split]:
                table[:, 2] = new[table[:, 2]]
                for number, count in zip(*np.unique(table[:, 2], return_counts=True), strict=True):
                    counts[order[int(number)]][split] += int(count)
        return {"labels": order, "label_counts": counts}


def pack_batches(
    batches: Iterable,
    out_dir: str,
    tokenizer=None,
    *,
    eval_percent: int,
    shard_tokens: int,
    slice_columns: Sequence[str] = ("source",),
    id_column: str = "id",
    text_column: str = "text",
) -> dict:
    """Pack every batch with a :class:`Packer`; raise StagingError for a row it cannot pack."""
    import numpy as np

    if tokenizer is None:
        tokenizer = ByteTokenizer()
    packer = Packer(
        out_dir,
        tokenizer,
        eval_percent=eval_percent,
        shard_tokens=shard_tokens,
        slice_columns=slice_columns,
        id_column=id_column,
        text_column=text_column,
    )
    row = 0
    for batch in batches:
        packer.add(batch, np.arange(row, row + batch.num_rows))
        row += batch.num_rows
    result = packer.close()
    if packer.problem:
        raise StagingError(packer.problem)
    return result


def json_value(value):
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
