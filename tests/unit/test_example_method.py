"""A method written outside fedx (examples/fedblend): its rule, its registration, a run by name.

The example package is installed with pip into a folder of the test's own
(no change to the environment), whose entry point then registers the method
for every process that has the folder on its path: this one's subprocesses,
and a simulation SuperLink started with it.
"""

import sys
import tomllib

import numpy as np
import pytest

from fedx import registry
from fedx.config import ConfigError, RunConfig
from fedx.registry import Method, register
from fedx.server.building import build_strategy
from fedx.strategies import to_model
from tests.support.helpers import REPO, install_example, run_python
from tests.support.standin_grid import NODE_IDS, StandInGrid, run_round

EXAMPLE = REPO / "examples" / "fedblend"
sys.path.insert(0, str(EXAMPLE))
from fedx_fedblend import METHOD, FedBlend  # noqa: E402  pylint: disable=wrong-import-position

sys.path.remove(str(EXAMPLE))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example installed by pip (entry points included) into a folder of its own."""
    return install_example(EXAMPLE, tmp_path_factory.mktemp("example"))


@pytest.mark.usefixtures("server_task_identity")
def test_every_model_is_blended_with_the_rounds_mean(initial):
    strategy = FedBlend(own_weight=0.25, seed=0, min_available_nodes=1)
    grid = StandInGrid(NODE_IDS[:4])
    run_round(strategy, grid, 1, initial)
    messages, replies, (arrays, _) = run_round(strategy, grid, 2, initial)
    # All K slots train: the i-th message carries slot i.
    reply_of = {reply.metadata.src_node_id: reply for reply in replies}
    trained = [to_model(reply_of[m.metadata.dst_node_id].content["arrays"]) for m in messages]
    for name, reference in initial.items():
        if reference.dtype.kind != "f":
            continue
        stacked = np.stack([model[name] for model in trained])
        mean = stacked.mean(axis=0)
        pool = np.stack([model[name] for model in strategy.pool])
        np.testing.assert_allclose(pool, 0.25 * stacked + 0.75 * mean, rtol=1e-5, atol=1e-6)
        # The pool keeps the round's mean, and its spread shrinks by w.
        np.testing.assert_allclose(pool.mean(axis=0), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(arrays[name].numpy(), mean, rtol=1e-5, atol=1e-6)
        assert np.allclose(pool - mean, 0.25 * (stacked - mean), atol=1e-6)
    with pytest.raises(ValueError, match=r"^own_weight must be a number in \[0, 1\], got 1.5$"):
        FedBlend(own_weight=1.5)


def test_its_entry_point_registers_it_by_name(installed):
    code = (
        "from fedx.registry import all_methods, get_method; "
        "method = get_method('fedblend'); strategy = method.strategy(own_weight=0.25); "
        "print(type(strategy).__name__, strategy.own_weight, [m.name for m in all_methods()][-1])"
    )
    assert run_python(code, installed).split() == ["FedBlend", "0.25", "fedblend"]
    # Without the installed package, fedx does not know the name.
    with pytest.raises(
        ConfigError, match=r"invalid run config strategy='fedblend': must be one of"
    ):
        RunConfig.from_mapping({"strategy": "fedblend"})


def test_register_in_process_and_its_own_app_config(monkeypatch):
    """``register`` (what fedx_fedblend/app.py does) and the example app's pyproject config."""
    monkeypatch.setattr(registry._REGISTRY, "_registered", {})  # pylint: disable=protected-access
    unregistered = Method("fedblend-test", FedBlend, "a copy under another name", keys=METHOD.keys)
    register(unregistered)
    with pytest.raises(ValueError, match="two methods are called 'fedblend-test'"):
        register(Method("fedblend-test", FedBlend, "another"))
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"
    ]
    cfg = RunConfig.from_mapping(
        {**config, "strategy": "fedblend-test", "fedblend-own-weight": 0.25}
    )
    strategy = build_strategy(cfg)
    assert isinstance(strategy, FedBlend) and strategy.own_weight == 0.25
    assert cfg.num_server_rounds == config["num-server-rounds"] and cfg.seed == 0  # fedx's default
    with pytest.raises(ConfigError) as error:
        build_strategy(
            RunConfig.from_mapping({"strategy": "fedblend-test", "fedblend-own-weight": -1.0})
        )
    assert (
        str(error.value)
        == "invalid run config fedblend-own-weight=-1.0: must be a number in [0, 1]"
    )
