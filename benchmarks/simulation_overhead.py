"""The command of fedx_bench/simulation_overhead.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, simulation_overhead

if __name__ == "__main__":
    common.run_reporting_errors(simulation_overhead.main)
