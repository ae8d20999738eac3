"""torchrun's own traceback folded into one line; the trainer's lines left as they are."""

from __future__ import annotations

import pytest

from trainops.cluster.torchrun_log import MAX_BLOCK_LINES, fold

# The end of node 0's log in the demo's preempted attempt, as torch 2.13's torchrun writes it
# (its trailing spaces written as \x20).
PREEMPTED_NODE_0 = """\
[trainer] preempted by SIGTERM: committed step 56, exiting
E1201 21:05:06.473000 20000 /venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 143) local_rank: 0 (pid: 20448) of binary: /venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
    elastic_launch(
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 194, in __call__
    return launch_agent(
           ^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\x20
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_21:05:06
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 143 (pid: 20448)\x20
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

# Node 1's torchrun, signalled by the injected preemption.
SIGNALLED_NODE_1 = """\
W1201 21:05:04.331000 20003 /venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
W1201 21:05:04.332000 20003 /venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 20447 closing signal SIGTERM
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
    elastic_launch(
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 194, in __call__
    return launch_agent(
           ^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 374, in launch_agent
    result = agent.run()
             ^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/metrics/api.py", line 134, in wrapper
    result = f(*args, **kwargs)
             ^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 745, in run
    result = self._invoke_run(role)
             ^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 20003 got signal: 15
"""

# A trainer that crashed: its own traceback (kept), then torchrun's (folded).
TRAINER_ERROR = """\
[trainer] data: 1 of 1 train shards are read by the remaining steps
Traceback (most recent call last):
  File "/app/trainer/train.py", line 88, in main
    raise ValueError("train.lr must be positive, not -1")
ValueError: train.lr must be positive, not -1
""" + PREEMPTED_NODE_0.split("\n", 1)[1].replace("143", "1")


def test_a_preempted_workers_torchrun_traceback_becomes_one_line():
    lines = PREEMPTED_NODE_0.splitlines()
    folded, used = fold(lines)
    assert used == len(lines)
    assert folded[0] == "[trainer] preempted by SIGTERM: committed step 56, exiting"
    assert folded[-1] == (
        "torchrun: worker rank 0 exited with code 143 (SIGTERM); torchrun's traceback is left out"
    )
    assert len(folded) == 3  # the trainer's line, torchrun's one-line error, the summary line
    assert not any("Traceback" in line or "ChildFailedError" in line or "=====" in line for line in folded)


def test_a_signalled_torchrun_says_which_signal():
    folded, _ = fold(SIGNALLED_NODE_1.splitlines())
    assert folded[-1] == "torchrun: stopped by SIGTERM; its traceback is left out"
    assert "Received 15 death signal, shutting down workers" in folded[0]
    assert not any("Traceback" in line for line in folded)


def test_the_trainers_own_error_is_kept_and_torchruns_folded():
    folded, _ = fold(TRAINER_ERROR.splitlines())
    assert folded[1:5] == [
        "Traceback (most recent call last):",
        '  File "/app/trainer/train.py", line 88, in main',
        '    raise ValueError("train.lr must be positive, not -1")',
        "ValueError: train.lr must be positive, not -1",
    ]
    assert folded[-1] == "torchrun: worker rank 0 exited with code 1; torchrun's traceback is left out"
    assert sum("Traceback" in line for line in folded) == 1


@pytest.mark.parametrize("cut", [3, 12, 20, 30])
def test_a_traceback_still_being_written_waits_for_the_rest(cut):
    lines = PREEMPTED_NODE_0.splitlines()
    folded, used = fold(lines[:cut], final=False)
    assert used == 2 and folded == lines[:2]  # up to the traceback's first line
    assert fold(lines[:cut], final=True) == (lines[:cut], cut)  # the last read: as it is


def test_an_endless_block_is_not_held_back():
    lines = ["Traceback (most recent call last):", *(["  frame"] * (MAX_BLOCK_LINES + 1))]
    assert fold(lines, final=False) == (lines, len(lines))
