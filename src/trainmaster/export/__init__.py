"""Exports of a job to other tools' formats (not backends)."""
