"""The command of fedx_bench/gpu_configs.py: its docstring, or ``--help``, says what it measures."""

from fedx_bench import common, gpu_configs

if __name__ == "__main__":
    common.run_reporting_errors(gpu_configs.main)
