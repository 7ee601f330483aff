"""Comparisons of methods: plan a grid of Flower simulations, run it, report it.

``fedx-compare`` (:mod:`fedx.compare.cli`) is the command; :mod:`~fedx.compare.plan`
turns settings × methods × seeds into runs, :mod:`~fedx.compare.runner` runs
them against one simulation SuperLink and :mod:`~fedx.compare.report` writes
the tables and plots.
"""

from fedx.compare.plan import PlannedRun, Setting, comparison_methods, default_methods, plan_runs
from fedx.compare.report import MethodSummary, RunResult, summarize_runs, write_report
from fedx.compare.runner import ComparisonRunner, RunOutcome

__all__ = [
    "ComparisonRunner",
    "MethodSummary",
    "PlannedRun",
    "RunOutcome",
    "RunResult",
    "Setting",
    "comparison_methods",
    "default_methods",
    "plan_runs",
    "summarize_runs",
    "write_report",
]
