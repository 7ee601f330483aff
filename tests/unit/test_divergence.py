"""A run that diverges stops early with its reason in metrics.json and a good checkpoint (issue 17)."""

import json
import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedx.config import ConfigError, RunConfig
from fedx.server_app import main
from fedx.strategies import (
    DivergenceGuard,
    FedMR,
    load_checkpoint,
    run_rounds,
    to_arrayrecord,
    to_model,
)
from tests.support.helpers import DEFAULTS, make_model
from tests.support.standin_grid import NODE_IDS, StandInGrid, real_clients_grid, trained_reply

pytestmark = pytest.mark.usefixtures("server_task_identity")


def _nan_in_rounds(rounds: set[int]):
    """Clients that train well, except in ``rounds``, where every model they send is NaN."""

    def reply(message: Message) -> Message | None:
        answer = trained_reply(message)
        if message.metadata.message_type != "train":
            return answer
        if int(message.content["config"]["server-round"]) in rounds:
            arrays = answer.content["arrays"]
            model = {
                n: np.full_like(a, np.nan) if a.dtype.kind == "f" else a
                for n, a in to_model(arrays).items()
            }
            answer.content["arrays"] = to_arrayrecord(model)
        return answer

    return reply


def _run(reply, guard, num_rounds=6, evaluate_fn=None):
    ended: list[int] = []
    strategy = FedMR(seed=0, min_available_nodes=1, fraction_evaluate=0.0)
    result = run_rounds(
        strategy,
        StandInGrid(NODE_IDS[:3], reply),
        initial_arrays=to_arrayrecord(make_model(np.random.default_rng(0))),
        num_rounds=num_rounds,
        timeout=5,
        evaluate_fn=evaluate_fn,
        on_round_end=lambda r, arrays, result: ended.append(r),
        guard=guard,
    )
    return result, ended


def test_consecutive_rounds_of_invalid_replies_stop_the_run(caplog):
    guard = DivergenceGuard(invalid_rounds=2)
    with caplog.at_level(logging.WARNING):
        result, ended = _run(_nan_in_rounds({2, 4, 5, 6}), guard)
    # Round 2 alone is forgiven; rounds 4 and 5 in a row stop the run.
    assert guard.stop_reason == (
        "diverged: no training reply could be used in 2 consecutive rounds "
        "(4-5; divergence-rounds=2)"
    )
    assert ended == [1, 3], "only rounds that ended well reach on_round_end (the checkpoints)"
    assert guard.last_good_round == 3
    assert sorted(result.train_metrics_clientapp) == [1, 3]
    stops = [r.getMessage() for r in caplog.records if "Stopped the run" in r.getMessage()]
    assert stops == [
        f"Stopped the run after round 5 of 6, {guard.stop_reason}; it ends with the state "
        "of round 3, the last that ended well"
    ]


def test_silence_is_not_divergence_and_zero_turns_the_check_off():
    guard = DivergenceGuard(invalid_rounds=1)
    _, ended = _run(lambda message: None, guard, num_rounds=3)
    assert guard.stop_reason is None and ended == [1, 2, 3]

    guard = DivergenceGuard(invalid_rounds=0)
    _, ended = _run(_nan_in_rounds({1, 2, 3}), guard, num_rounds=3)
    assert guard.stop_reason is None and ended == [1, 2, 3]


@pytest.mark.parametrize(
    "losses, guard, reason",
    [
        (
            [2.0, 1.0, float("nan")],
            DivergenceGuard(),
            "diverged: the central loss of round 2 is nan",
        ),
        (
            [2.0, 1.0, 2.0e4],
            DivergenceGuard(loss_ratio=1000.0),
            "diverged: the central loss of round 2 is 2e+04, more than "
            "divergence-loss-ratio=1000 times the initial model's 2",
        ),
        ([2.0, 1.0, 2.0e4, float("inf")], DivergenceGuard(nonfinite=False, loss_ratio=0), None),
    ],
)
def test_a_central_loss_that_blows_up_stops_the_run_at_once(losses, guard, reason):
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"loss": losses[server_round]})

    result, ended = _run(trained_reply, guard, num_rounds=len(losses) - 1, evaluate_fn=evaluate)
    assert guard.stop_reason == reason
    if reason is not None:
        assert ended == [1] and guard.last_good_round == 1
        # The result holds the global model of round 1, not the one that blew up.
        assert result.arrays is guard.last_good_arrays
    else:
        assert ended == list(range(1, len(losses)))


def test_a_nonfinite_global_model_stops_the_run():
    guard = DivergenceGuard()
    guard.start(0, to_arrayrecord(make_model(np.random.default_rng(0))))
    bad = make_model(np.random.default_rng(1))
    bad["fc1.bias"][0] = np.inf
    guard.after_training(1, [], to_arrayrecord(bad), MetricRecord())
    assert guard.stop_reason == "diverged: the global model of round 1 holds NaN or Inf"
    assert not guard.round_ok


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("divergence-rounds", -1, "an integer >= 0"),
        ("divergence-nonfinite", 1, "true or false"),
        ("divergence-loss-ratio", -2.0, "a number in [0, inf)"),
    ],
)
def test_the_divergence_keys_are_checked(key, value, allowed):
    with pytest.raises(ConfigError) as error:
        RunConfig.from_mapping({**DEFAULTS, key: value})
    assert str(error.value) == f"invalid run config {key}={value!r}: must be {allowed}"


def test_fedmut_that_diverges_on_digits_stops_early_with_its_reason(tmp_path, caplog):
    """FedMut's mutation range alpha = 1000 with lr 0.5: the clients' models blow up to NaN.

    Four real ClientApps on digits, one local epoch. The initial-loss check is
    off here so that the run ends by the issue's first rule: consecutive
    rounds in which every reply was NaN.
    """
    config = {
        **DEFAULTS,
        "strategy": "fedmut",
        "fedmut-alpha": 1000.0,
        "learning-rate": 0.5,
        "local-epochs": 1,
        "num-server-rounds": 8,
        "divergence-rounds": 2,
        "divergence-loss-ratio": 0.0,
        "min-available-nodes": 4,
        "output-dir": str(tmp_path),
        "run-name": "diverged",
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with caplog.at_level(logging.WARNING):
            main(
                real_clients_grid([1, 2, 3, 4], config),
                Context(1, 0, {}, RecordDict(), config),
            )
    finally:
        torch.set_num_threads(threads)
    directory = tmp_path / "diverged"
    metrics = json.loads((directory / "metrics.json").read_text())
    assert metrics["stop-reason"] == (
        "diverged: no training reply could be used in 2 consecutive rounds "
        "(3-4; divergence-rounds=2)"
    )
    assert [row["round"] for row in metrics["rounds"]] == [0, 1, 2, 3, 4]
    assert sum("Stopped the run after round 4 of 8" in r.getMessage() for r in caplog.records) == 1
    # The checkpoint and the saved model are those of round 2, the last good round.
    checkpoint = load_checkpoint(directory)
    assert checkpoint.server_round == 2
    saved = torch.load(directory / "model.pt")
    for name, array in checkpoint.state["arrays"].items():
        np.testing.assert_array_equal(saved[name].numpy(), array)
        assert np.isfinite(array).all()
