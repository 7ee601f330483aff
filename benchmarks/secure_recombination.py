"""The command of fedx_bench/secure_recombination.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, secure_recombination

if __name__ == "__main__":
    common.run_reporting_errors(secure_recombination.main)
