"""The command of fedx_bench/hostile_replies.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, hostile_replies

if __name__ == "__main__":
    common.run_reporting_errors(hostile_replies.main)
