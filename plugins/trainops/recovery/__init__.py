"""What happened to an attempt and what to do next: classification, the recovery policy, and
the job.json record as a fold over attempts. Pure functions over plain records."""
