"""What somebody else's Flower app (examples/numpy-plugin) needs of fedx: numpy and Flower only.

Its runs under Flower's Ray simulation, with fedx's strategies:
tests/system/test_plugin_app.py.
"""

import subprocess
import sys
from pathlib import Path

from tests.support.helpers import environment_with_path

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "examples" / "numpy-plugin"


def test_the_plugin_app_imports_no_torch_and_no_scikit_learn():
    # numpy and Flower are all a user of fedx.strategies needs (FedMe imports
    # scikit-learn only when it clusters).
    code = (
        "import sys; import numpy_plugin.server_app, numpy_plugin.client_app; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'sklearn')]; "
        "assert not bad, bad"
    )
    env = environment_with_path(PLUGIN_DIR)  # where Flower is on PYTHONPATH, it stays there
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr
