"""The command of fedx_bench/idle_federation.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, idle_federation

if __name__ == "__main__":
    common.run_reporting_errors(idle_federation.main)
