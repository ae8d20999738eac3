"""The report page's URL: the stored record's URI, encoded whole, under Airflow's base URL."""

from trainops.reports.urls import report_url


def test_the_uri_is_encoded_whole_under_the_base_url():
    uri = "s3://bucket/runs/d/manual__2026-01-01T00:00:00+00:00/train/job.json"
    assert report_url(uri, "https://airflow.example.com/af/") == (
        "https://airflow.example.com/af/trainops/report?uri="
        "s3%3A%2F%2Fbucket%2Fruns%2Fd%2Fmanual__2026-01-01T00%3A00%3A00%2B00%3A00%2Ftrain%2Fjob.json"
    )
    assert report_url("file:///r/x.json", "").startswith("/trainops/report?uri=file%3A%2F%2F%2F")
