"""Runnable example pipelines; each folder has its pipeline and its unit tests."""
