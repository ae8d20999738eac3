"""The model registry: versions, the production pointer (moved only by compare-and-swap),
promotion, re-gating, rollback, the lineage card and retention."""
