"""Importer workers and the Spark side of logjam-mesh: decode Logjam messages into rows and append them to Spark."""
