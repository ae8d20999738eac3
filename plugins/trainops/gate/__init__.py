"""The evaluation gate's checks: thresholds and no-regression (:mod:`.checks`) and per-slice
checks as great-expectations expectations over the metrics table (:mod:`.slices`), with their
records (:mod:`.records`), numeric fields (:mod:`.fields`) and errors (:mod:`.errors`). Pure."""
