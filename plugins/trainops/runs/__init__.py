"""A run as a person asks about it, from storage alone (no Airflow): which run a reference
names (:mod:`.refs`), what is known of it (:mod:`.facts`), and its outcome in one vocabulary
(:mod:`.outcome`), shared by the terminal's verbs (``python -m trainops runs``, ``status``,
``logs``, ``models``, ``report``)."""
