"""The `messages` table's own rules, shared by its writers (logjam-importer) and its maintenance (logjam-spark)."""
