"""Token offsets of the Spark engine's streams (the pure part)."""

from trainops.staging.spark.pack import chunk_offsets


def test_blocks_are_placed_in_row_order_within_each_split():
    # (is_eval, block, tokens, records), in any order
    sums = [(False, 1, 50, 5), (True, 0, 7, 1), (False, 0, 100, 10), (True, 2, 3, 1)]
    offsets, totals = chunk_offsets(sums)
    assert offsets == {(False, 0): 0, (False, 1): 100, (True, 0): 0, (True, 2): 7}
    assert totals == {"train": {"tokens": 150, "records": 15}, "eval": {"tokens": 10, "records": 2}}
