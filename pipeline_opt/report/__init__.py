"""Presenting: text tables, JSON, self-contained HTML with plots, the baseline ledger.

Importing this package registers its renderers (:mod:`pipeline_opt._core.render`), which the
results' ``table()`` and ``save()`` use.
"""

from pipeline_opt._core.render import register_renderer
from pipeline_opt.report.html import render_profile_html, render_tune_html
from pipeline_opt.report.text import profile_table, tune_table

register_renderer("profile_table", profile_table)
register_renderer("profile_html", render_profile_html)
register_renderer("tune_table", tune_table)
register_renderer("tune_html", render_tune_html)
