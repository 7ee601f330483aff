"""The command of fedx_bench/startup.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, startup

if __name__ == "__main__":
    common.run_reporting_errors(startup.main)
