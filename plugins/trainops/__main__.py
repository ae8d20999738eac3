import sys

VERBS = ("runs", "status", "logs", "models", "report")  # trainops.cli.runs.COMMANDS

if len(sys.argv) > 1 and sys.argv[1] in VERBS:  # the fast path: storage only, no Airflow import
    from trainops.cli.runs import run_verb

    sys.exit(run_verb(sys.argv[1:]))
else:
    from trainops.cli.main import main

    sys.exit(main())
