"""The command of fedx_bench/server_ops.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, server_ops

if __name__ == "__main__":
    common.run_reporting_errors(server_ops.main)
