"""The report app (``/trainops/report``) and the pages it renders from stored records."""
