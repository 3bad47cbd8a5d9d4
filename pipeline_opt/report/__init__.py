"""Presenting: text tables, JSON, self-contained HTML with plots, the baseline ledger, progress."""
