"""Checkpoints of a run: saving and committing them (``save``, ``commit``, ``staging``), the fence
that voids a stale attempt's (``fence``), finding and fetching them to resume (``files``, ``reads``,
``node_cache``), and a run's first weights from another model (``warm_start``)."""
