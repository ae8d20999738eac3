"""What the example DAGs share, by concept: the settings form (:mod:`.form`), the pipeline
(:mod:`.pipeline`), the raw data sources (:mod:`.sources`) and the dry run (:mod:`.dry_run`)."""
