"""Progress of a live run, from its metrics (the home page's tests hold the details)."""

from trainops.runs.progress import progress


def test_the_rate_and_eta_of_the_newest_attempt():
    records = [{"step": s, "attempt": 1, "time": 100.0 + 2 * s} for s in range(1, 11)]
    p = progress(records, 30, now=120.0)
    assert (p["step"], p["steps_per_s"], p["eta_s"], p["age_s"]) == (10, 0.5, 40.0, 0.0)
    assert progress([], 30, now=0.0) is None
