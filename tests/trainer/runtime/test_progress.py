"""The progress line rank 0 prints: fields, durations, and the ETA from this attempt's pace."""

from trainer.runtime.progress import format_duration, progress_line

BASE = "step 40/100 loss 2.314 lr 2.1e-03 tok/s 12,345 elapsed 12s eta 18s"


def test_optional_fields_appear_only_when_given():
    assert progress_line(40, 100, 2.3141, 2.1e-3, 12345.4, 12.2, 40) == BASE
    assert progress_line(40, 100, 2.3141, 2.1e-3, 12345.4, 12.2, 40, mfu=0.41234) == BASE + " mfu 41.2%"
    assert (
        progress_line(40, 100, 2.3141, 2.1e-3, 12345.4, 12.2, 40, peak_mem_gib=12.34) == BASE + " mem 12.3GiB"
    )
    assert (
        progress_line(40, 100, 2.3141, 2.1e-3, 12345.4, 12.2, 40, mfu=0.05, peak_mem_gib=0.0)
        == BASE + " mfu 5.0% mem 0.0GiB"
    )


def test_progress_line_format():
    line = progress_line(40, 100, 2.3141, 2.1e-3, 12345.4, 12.2, 40)
    assert line == "step 40/100 loss 2.314 lr 2.1e-03 tok/s 12,345 elapsed 12s eta 18s"
    # a resumed attempt extrapolates from its own steps only
    assert progress_line(90, 100, 1.0, 1e-4, 10, 20, 10).endswith("elapsed 20s eta 20s")
    assert [format_duration(s) for s in (0, 59.6, 61, 3725)] == ["0s", "1m00s", "1m01s", "1h02m"]
