"""The command of fedx_bench/links.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, links

if __name__ == "__main__":
    common.run_reporting_errors(links.main)
