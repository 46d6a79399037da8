"""logjam-spark: the Spark server of the mesh and the table maintenance it runs (compaction, retention)."""
