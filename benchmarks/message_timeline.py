"""The command of fedx_bench/message_timeline.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, message_timeline

if __name__ == "__main__":
    common.run_reporting_errors(message_timeline.main)
