"""The command of fedx_bench/deployment.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, deployment

if __name__ == "__main__":
    common.run_reporting_errors(deployment.main)
