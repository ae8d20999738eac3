"""The attempts' log tails on a run's report: folded, cut to their end, saying where the rest is."""

from __future__ import annotations

from tests.trainops.reports.helpers import page_text
from trainops.reports.log_tails import LOG_LINES, attempt_logs, tail_lines

ATTACK = "<script>alert(1)</script>"


def test_a_tail_keeps_the_last_lines_and_counts_them_all():
    text = "\n".join(str(i) for i in range(1, 101))
    shown, total = tail_lines(text)
    assert (len(shown), total, shown[0], shown[-1]) == (LOG_LINES, 100, "41", "100")
    assert tail_lines("a\nb") == (["a", "b"], 2)


def test_a_kubernetes_attempt_names_the_command_for_its_whole_log_and_nothing_is_open():
    job = {
        "attempts": [
            {"attempt": 1, "logs_tail": ""},  # kept nothing: no section for it
            {
                "attempt": 2,
                "classification": "preempted",
                "logs_tail": f"step 1\n{ATTACK}\n",
                "spec": {"namespace": "ml"},
                "state": {"nodes": [{"index": 0, "pod": "train-a2-0"}, {"index": 1, "pod": "train-a2-1"}]},
            },
            {"attempt": 3, "logs_tail": "done", "job_name": "train-a3"},
        ]
    }
    html = attempt_logs(job)
    text = page_text(html)
    assert "<script" not in html and "<details open" not in html and html.count("<details") == 2
    assert "Log tail of attempt 2 (preempted) (2 lines, 33 bytes kept in job.json)" in text
    assert (
        "The whole log: kubectl logs -n ml train-a2-0, kubectl logs -n ml train-a2-1 (while the pods exist)."
        in text
    )
    assert "Log tail of attempt 3 (1 line, 4 bytes kept in job.json)" in text
    assert "kubectl logs job/train-a3" in text
    assert attempt_logs({"attempts": [{"attempt": 1}]}) == ""
