"""Debug replay: freeze sampled batches into Parquet, rerun reward and train forward on them, diff (issue 5)."""
