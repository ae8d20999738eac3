import numpy as np
import pytest
import torch

from trainer import data
from trainer.storage import open_storage


def test_sample_order_is_a_permutation_fixed_by_seed_and_epoch():
    a = data.sample_order(100, seed=5, epoch=0)
    assert sorted(a.tolist()) == list(range(100))
    assert torch.equal(a, data.sample_order(100, seed=5, epoch=0))
    assert not torch.equal(a, data.sample_order(100, seed=5, epoch=1))
    assert not torch.equal(a, data.sample_order(100, seed=6, epoch=0))


def test_cursor_crosses_epochs():
    order = data.SampleOrder(num_samples=10, seed=1)
    first = [order.sample_id(p) for p in range(10)]
    second = [order.sample_id(p) for p in range(10, 20)]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first == data.sample_order(10, 1, 0).tolist() and second == data.sample_order(10, 1, 1).tolist()
    assert order.sample_id(3) == first[3]  # going back to an earlier epoch recomputes it


def test_the_samples_of_a_stream_are_counted_by_the_operators_rule(tmp_path):
    """One rule counts samples (``trainer.config.samples_in``), for the operator's check before
    launch and for the batches the trainer reads: windows of seq_len + 1 tokens."""
    from trainer.config import samples_in

    for tokens, seq_len, samples in [(65, 32, 2), (64, 32, 1), (97, 32, 3)]:  # 65: [0, 33), [32, 65)
        path = tmp_path / f"{tokens}.bin"
        path.write_bytes(np.arange(tokens).astype("<u2").tobytes())
        batches = data.TrainBatches(data.TokenStream([path], "uint16"), seq_len, 0, 1, 1, 0)
        assert batches.order.num_samples == samples_in(tokens, seq_len) == samples
        last = batches.window(samples - 1)  # the last window ends inside the stream
        assert last.tolist() == list(range((samples - 1) * seq_len, samples * seq_len + 1))


def test_the_manifest_states_what_the_fit_check_needs(dataset_uri, tmp_path):
    storage = open_storage(dataset_uri)
    manifest = data.read_manifest(storage, dataset_uri)
    tokens, vocab = data.manifest_numbers(manifest, dataset_uri)
    assert (tokens, vocab) == (manifest["splits"]["train"]["tokens"], 257)
    del manifest["tokenizer"]["vocab_size"]
    with pytest.raises(
        data.DataError, match=r"lacks splits.train.tokens or tokenizer.vocab_size: re-stage the dataset"
    ):
        data.manifest_numbers(manifest, dataset_uri)


@pytest.mark.parametrize("world_size, micro, accum", [(1, 4, 1), (2, 4, 2), (4, 2, 3)])
def test_rank_slices_partition_the_global_batch(world_size, micro, accum):
    cursor = 1000
    seen = [
        p
        for step_micro in range(accum)
        for rank in range(world_size)
        for p in data.micro_batch_positions(cursor, step_micro, micro, world_size, rank)
    ]
    global_batch = data.global_batch_size(micro, accum, world_size)
    assert sorted(seen) == list(range(cursor, cursor + global_batch))
    # each rank's slice of a micro-batch is contiguous
    assert list(data.micro_batch_positions(cursor, 1, micro, world_size, 0)) == list(
        range(cursor + micro * world_size, cursor + micro * world_size + micro)
    )


def test_same_global_batch_on_another_world_size():
    # Two ranks x accum 2 and one rank x accum 4 consume the same positions per step.
    two = {p for m in range(2) for r in range(2) for p in data.micro_batch_positions(40, m, 3, 2, r)}
    one = {p for m in range(4) for p in data.micro_batch_positions(40, m, 3, 1, 0)}
    assert two == one


def test_token_stream_reads_across_shards(tmp_path):
    paths = []
    for i, chunk in enumerate([np.arange(0, 5), np.arange(5, 12), np.arange(12, 13)]):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(chunk.astype("<u2").tobytes())
        paths.append(path)
    stream = data.TokenStream(paths, "uint16")
    assert len(stream) == 13
    assert stream.read(3, 13).tolist() == list(range(3, 13))
    assert stream.read(5, 5).tolist() == []
    with pytest.raises(IndexError, match=r"token range \[10, 14\) is outside a stream of 13 tokens"):
        stream.read(10, 14)


def test_batches_from_a_staged_dataset(dataset_uri):
    storage = open_storage(dataset_uri)
    manifest = data.read_manifest(storage, dataset_uri)
    stream = data.open_split(storage, dataset_uri, manifest, "train")
    assert len(stream) == manifest["splits"]["train"]["tokens"]
    batches = data.TrainBatches(stream, seq_len=16, seed=3, micro_batch_size=4, world_size=2, rank=1)
    windows = batches.micro_batch(cursor=8, micro_step=0)
    assert windows.shape == (4, 17) and windows.dtype == torch.int64 and not windows.is_pinned()
    inputs, targets = data.inputs_and_targets(windows)
    assert inputs.shape == targets.shape == (4, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are inputs shifted by one
    sample = batches.order.sample_id(8 + 4)  # rank 1 starts after rank 0's 4 samples
    assert inputs[0].tolist() == stream.read(sample * 16, sample * 16 + 16).tolist()


def test_shard_checksum_mismatch_is_an_error(tmp_path):
    from tests.trainer.helpers import write_dataset

    uri = write_dataset(tmp_path / "ds", train_records=20, eval_records=5)
    (tmp_path / "ds" / "train" / "00000.bin").write_bytes(b"\x00\x01" * 10)
    storage = open_storage(uri)
    with pytest.raises(
        data.DataError, match=r"train/00000.bin has sha256 .*, the manifest says .*; re-stage the dataset"
    ):
        data.fetch_split(storage, uri, data.read_manifest(storage, uri), "train")


def test_not_a_manifest_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": "other"}')
    with pytest.raises(data.DataError, match=r"is not a trainops.dataset/v1 manifest"):
        data.read_manifest(open_storage(tmp_path.as_uri()), tmp_path.as_uri())


def test_sample_order_leaves_the_global_rng_alone():
    torch.manual_seed(11)
    state = torch.get_rng_state()
    data.sample_order(50, seed=5, epoch=2)
    data.SampleOrder(num_samples=50, seed=5).sample_id(70)
    assert torch.equal(torch.get_rng_state(), state)


def shards_of(tmp_path, sizes: list[int]) -> data.TokenStream:
    """A stream of tokens 0, 1, 2, ... cut into shards of ``sizes``."""
    paths, start = [], 0
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(np.arange(start, start + size).astype("<u2").tobytes())
        paths.append(path)
        start += size
    return data.TokenStream(paths, "uint16")


def per_sample_windows(batches: data.TrainBatches, cursor: int, micro_step: int) -> torch.Tensor:
    """The reading this replaced: one sample id and one ``read`` per sample, then a stack."""
    positions = data.micro_batch_positions(
        cursor, micro_step, batches.micro_batch_size, batches.world_size, batches.rank
    )
    starts = [batches.order.sample_id(p) * batches.seq_len for p in positions]
    return torch.from_numpy(np.stack([batches.stream.read(s, s + batches.seq_len + 1) for s in starts]))


def test_windows_are_gathered_in_one_go_across_shard_boundaries(tmp_path):
    stream = shards_of(tmp_path, [7, 5, 1, 20])  # two shards shorter than a window
    starts = np.array([0, 3, 5, 6, 11, 12, 20, 26])  # inside one shard, across one, across three
    windows = stream.gather(starts, 7)
    assert windows.dtype == np.int64 and windows.shape == (8, 7)
    assert windows.tolist() == [stream.read(s, s + 7).tolist() for s in starts]
    out = np.full((2, 7), -1, dtype=np.int64)
    assert stream.gather(np.array([4, 9]), 7, out=out) is out and out[1].tolist() == list(range(9, 16))
    assert stream.gather(np.array([], dtype=np.int64), 7).shape == (0, 7)
    with pytest.raises(IndexError, match=r"token range \[27, 34\) is outside a stream of 33 tokens"):
        stream.gather(np.array([0, 27]), 7)
    with pytest.raises(IndexError, match=r"token range \[-1, 6\) is outside a stream of 33 tokens"):
        stream.gather(np.array([-1]), 7)


def test_micro_batches_hold_the_per_sample_reads_bit_for_bit_across_epochs_and_shards(tmp_path):
    # 4 shards of 50 tokens: 24 samples of seq_len 8 (windows of 9 cross the shard boundaries);
    # 3 steps of 16 samples on 2 ranks cross the epoch boundary at position 24 and again at 48.
    stream = shards_of(tmp_path, [50, 50, 50, 50])
    for rank in (0, 1):
        batches = data.TrainBatches(stream, seq_len=8, seed=9, micro_batch_size=4, world_size=2, rank=rank)
        assert batches.order.num_samples == 24
        for cursor in (0, 16, 32, 48):
            for micro in (0, 1):
                windows = batches.micro_batch(cursor, micro)
                assert torch.equal(windows, per_sample_windows(batches, cursor, micro)), (rank, cursor, micro)


def test_sample_ids_of_many_positions_are_the_one_by_one_ids():
    order = data.SampleOrder(num_samples=10, seed=4)
    positions = np.array([8, 9, 10, 11, 35, 3])  # epochs 0, 1, 3 and back to 0
    assert order.sample_ids(positions).tolist() == [
        data.SampleOrder(num_samples=10, seed=4).sample_id(int(p)) for p in positions
    ]
    assert len(order._perms) <= data.EPOCHS_KEPT  # the permutations kept stay few


def read_log(batches: data.TrainBatches) -> list[tuple[int, int]]:
    """Wrap ``batches.micro_batch`` to record each (cursor, micro-step) read, in order."""
    reads: list[tuple[int, int]] = []
    original = batches.micro_batch

    def micro_batch(cursor: int, micro_step: int) -> torch.Tensor:
        reads.append((cursor, micro_step))
        return original(cursor, micro_step)

    batches.micro_batch = micro_batch  # type: ignore[method-assign]
    return reads


def test_the_feed_reads_a_prefetched_micro_batch_once_and_only_the_one_asked_for(tmp_path):
    stream = shards_of(tmp_path, [200])
    batches = data.TrainBatches(stream, seq_len=8, seed=1, micro_batch_size=2, world_size=1, rank=0)
    feed = data.DeviceFeed(batches, torch.device("cpu"))
    reads = read_log(batches)
    assert batches.pin_memory is False  # no pinning on a host without CUDA

    inputs, targets = feed.get(0, 0)  # nothing prefetched: read now
    feed.prefetch(0, 1)
    assert reads == [(0, 0), (0, 1)]  # read at the prefetch, not at the get
    again_inputs, again_targets = feed.get(0, 1)
    assert reads == [(0, 0), (0, 1)]
    expected = batches.micro_batch(0, 1)
    assert torch.equal(again_inputs, expected[:, :-1]) and torch.equal(again_targets, expected[:, 1:])
    assert torch.equal(inputs[:, 1:], targets[:, :-1])

    feed.prefetch(2, 0)
    with pytest.raises(
        RuntimeError,
        match=r"micro-batch 0 at cursor 2 was prefetched, but the loop asks for micro-batch 0 at cursor 4",
    ):
        feed.get(4, 0)


@pytest.mark.gpu
def test_on_cuda_the_feed_reads_into_pinned_memory_and_copies_on_its_own_stream(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    stream = shards_of(tmp_path, [200])
    batches = data.TrainBatches(stream, seq_len=8, seed=1, micro_batch_size=2, world_size=1, rank=0)
    device = torch.device("cuda", 0)
    feed = data.DeviceFeed(batches, device)
    assert batches.pin_memory and batches.micro_batch(0, 0).is_pinned()
    feed.prefetch(0, 0)
    inputs, targets = feed.get(0, 0)
    assert inputs.device == device
    expected = batches.micro_batch(0, 0)
    assert torch.equal(inputs.cpu(), expected[:, :-1]) and torch.equal(targets.cpu(), expected[:, 1:])


def test_the_shards_are_fetched_once_per_node_and_verified(tmp_path, monkeypatch):
    from tests.trainer.helpers import CountingDownloads as Counting
    from tests.trainer.helpers import write_dataset

    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "node"))
    uri = write_dataset(tmp_path / "ds", train_records=20, eval_records=5)
    storage = Counting(open_storage(uri))
    manifest = data.read_manifest(storage, uri)
    first = data.fetch_split(storage, uri, manifest, "train")
    again = data.fetch_split(storage, uri, manifest, "train")  # another rank of the node
    assert first == again and len(storage.downloads) == len(manifest["splits"]["train"]["shards"])
    for path, shard in zip(first, manifest["splits"]["train"]["shards"], strict=True):
        assert path.read_bytes() == (tmp_path / "ds" / shard["path"]).read_bytes()


@pytest.mark.parametrize(("positions", "seq_len"), [(range(6), 8), (range(120, 128), 8), (range(3, 9), 30)])
def test_the_shards_the_remaining_steps_read_are_exactly_those_their_windows_touch(
    tmp_path, positions, seq_len
):
    # 40 shards of 23 to 32 tokens: windows of 9 (or 31) tokens cross shard boundaries, some by
    # their last token only (a shard of 24 after one of 32), and positions 120 to 127 cross an
    # epoch (123 samples of 8 tokens)
    shard_tokens = [(24, 32, 25, 23)[i % 4] for i in range(40)]
    paths, first_token = [], 0
    for i, n in enumerate(shard_tokens):
        path = tmp_path / f"{i}.bin"
        np.arange(first_token + 1, first_token + 1 + n, dtype=np.uint16).tofile(path)  # never 0
        paths.append(path)
        first_token += n
    wanted = data.shards_read(shard_tokens, seq_len, seed=3, positions=positions)
    assert 0 < len(wanted) < len(shard_tokens)

    def batches(only):  # the shards outside ``only`` hold zeros: the windows must not see them
        files = []
        for i, path in enumerate(paths):
            if i not in only:
                path = tmp_path / f"zero{i}.bin"
                np.zeros(shard_tokens[i], dtype=np.uint16).tofile(path)
            files.append(path)
        batches = data.TrainBatches(data.TokenStream(files, "uint16"), seq_len, 3, 1, 1, 0)
        return [[t.tolist() for t in batches.micro_batch(p, 0)] for p in positions]  # inputs, targets

    assert batches(set(wanted)) == batches(set(range(40)))
    for dropped in wanted:  # and each shard named is read by one of the windows
        assert batches(set(wanted) - {dropped}) != batches(set(range(40)))
    assert data.remaining_positions(cursor=40, step=5, max_steps=8, global_batch=8) == range(40, 64)
    assert data.shards_read(shard_tokens, seq_len, 3, range(0)) == []


def test_a_split_opened_for_some_shards_fetches_only_those_and_refuses_to_read_the_others(
    tmp_path, monkeypatch
):
    from tests.trainer.helpers import write_dataset

    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "node"))
    uri = write_dataset(tmp_path / "ds", train_records=300, shard_tokens=2000)
    storage = open_storage(uri)
    manifest = data.read_manifest(storage, uri)
    shards = manifest["splits"]["train"]["shards"]
    assert len(shards) >= 3
    whole = data.open_split(storage, uri, manifest, "train")
    for path in (tmp_path / "node" / "shards").glob("*.bin"):
        path.unlink()  # a fresh node

    part = data.open_split(storage, uri, manifest, "train", only=[1])
    assert len(part) == len(whole)  # offsets from the manifest: the same global token positions
    assert [p.name for p in (tmp_path / "node" / "shards").glob("*.bin")] == [f"{shards[1]['sha256']}.bin"]
    lo, hi = int(part.offsets[1]), int(part.offsets[2])
    assert part.read(lo, hi).tolist() == whole.read(lo, hi).tolist()
    assert part.gather(np.array([lo, lo + 5]), 9).tolist() == whole.gather(np.array([lo, lo + 5]), 9).tolist()
    with pytest.raises(data.DataError, match=r"train shard 0 was not fetched"):
        part.read(0, 4)
    with pytest.raises(data.DataError, match=r"train shard 2 was not fetched"):
        part.gather(np.array([hi - 3]), 9)  # a window that crosses into shard 2
