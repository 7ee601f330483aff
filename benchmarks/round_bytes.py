"""The command of fedx_bench/round_bytes.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, round_bytes

if __name__ == "__main__":
    common.run_reporting_errors(round_bytes.main)
