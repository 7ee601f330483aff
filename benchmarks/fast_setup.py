"""The command of fedx_bench/fast_setup.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, fast_setup

if __name__ == "__main__":
    common.run_reporting_errors(fast_setup.main)
