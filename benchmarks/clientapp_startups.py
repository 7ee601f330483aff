"""The command of fedx_bench/clientapp_startups.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import clientapp_startups, common

if __name__ == "__main__":
    common.run_reporting_errors(clientapp_startups.main)
