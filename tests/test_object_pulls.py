"""fedx.object_pulls: how soon Flower's object pulls ask again for an object not there yet."""

import time

import pytest
from flwr.supercore.inflatable import inflatable_utils

from fedx import object_pulls
from fedx.object_pulls import (
    PULL_FUNCTIONS,
    RETRY_KEYWORDS,
    restore_object_pulls,
    retry_object_pulls_after,
)

#: Flower 1.41's retry keywords (a ServerApp's exchange run earlier in this
#: process may have changed them: fedx's ServerApp sets them for its process).
FLOWERS = {
    "initial_backoff": inflatable_utils.PULL_INITIAL_BACKOFF,
    "backoff_cap": inflatable_utils.PULL_BACKOFF_CAP,
    "max_tries_per_object": inflatable_utils.PULL_MAX_TRIES_PER_OBJECT,
}


@pytest.fixture(autouse=True)
def flowers_waits(monkeypatch):
    """Flower's retry keywords during every test, and what was there before after it."""
    for function in PULL_FUNCTIONS:
        for keyword in RETRY_KEYWORDS:
            monkeypatch.setitem(function.__kwdefaults__, keyword, FLOWERS[keyword])


def pulls_of_an_object_that_arrives_late(late: int) -> list[float]:
    """When Flower's ``pull_objects`` asked for an object that is there from the ``late``-th ask."""
    asked = []

    def pull(object_id: str) -> bytes:
        asked.append(time.monotonic())
        if len(asked) < late:
            raise inflatable_utils.ObjectUnavailableError(object_id)
        return b"content"

    assert inflatable_utils.pull_objects(["object"], pull) == {"object": b"content"}
    return asked


def test_a_short_first_wait_and_cap_replace_flowers_1_to_10_s():
    before = retry_object_pulls_after(0.02, 0.05)
    assert (
        before == FLOWERS == {"initial_backoff": 1, "backoff_cap": 10, "max_tries_per_object": 500}
    )
    for function in PULL_FUNCTIONS:
        assert function.__kwdefaults__["initial_backoff"] == 0.02
        assert function.__kwdefaults__["backoff_cap"] == 0.05
        # The wait is bounded by Flower's max_time alone (500 short tries would end it early).
        assert function.__kwdefaults__["max_tries_per_object"] is None
        assert function.__kwdefaults__["max_time"] == 7200
    asked = pulls_of_an_object_that_arrives_late(5)
    gaps = [later - earlier for earlier, later in zip(asked, asked[1:], strict=False)]
    # Flower would wait 0.8-1.2 s before the second ask and 1.6-2.4 s before the third.
    assert len(gaps) == 4 and max(gaps) < 0.5, gaps
    restore_object_pulls(before)
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 1
    assert inflatable_utils.pull_and_inflate_object_from_tree.__kwdefaults__["backoff_cap"] == 10


def test_a_first_wait_of_a_second_or_more_keeps_flowers_waits():
    retry_object_pulls_after(3.0)  # fedx's ServerApp with FEDX_REPLY_PULL_INTERVAL=3
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 1
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == 10
    retry_object_pulls_after(0.5, 0.25)  # a longest wait below the first counts as the first
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == 0.5


def test_bad_waits_and_another_flower_are_refused(monkeypatch):
    for first in (0, -1.0):
        with pytest.raises(ValueError, match="must be positive"):
            retry_object_pulls_after(first)

    def pull_objects(object_ids, pull_object_fn, *, backoff=1):  # no initial_backoff
        del object_ids, pull_object_fn, backoff

    monkeypatch.setattr(object_pulls, "PULL_FUNCTIONS", (pull_objects,))
    with pytest.raises(RuntimeError, match="flwr 1.41"):
        retry_object_pulls_after(0.1)


def test_the_serverapps_exchange_pulls_reply_objects_at_its_own_pace():
    from fedx.messaging import send_and_collect  # pylint: disable=import-outside-toplevel

    class Grid:  # no reply ever: one push, pulls until the timeout
        def push_messages(self, messages):
            return ["id-1"]

        def pull_messages(self, message_ids):
            return []

    class Message:  # what send_and_collect reads of a pushed message
        class metadata:  # pylint: disable=invalid-name
            message_id, dst_node_id = "id-1", 7

    send_and_collect(Grid(), [Message()], timeout=0.05, first_interval=0.01, max_interval=0.2)
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 0.01
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == 0.2


def test_a_flower_whose_pulls_cannot_be_set_keeps_its_waits_and_the_exchange_goes_on(
    monkeypatch, caplog
):
    from fedx import messaging  # pylint: disable=import-outside-toplevel

    def pull_objects(object_ids, pull_object_fn, *, backoff=1):  # no initial_backoff
        del object_ids, pull_object_fn, backoff

    monkeypatch.setattr(object_pulls, "PULL_FUNCTIONS", (pull_objects,))
    monkeypatch.setattr(messaging, "_object_pulls_unset", False)

    class Grid:  # one reply, at the first pull
        def push_messages(self, messages):
            return ["id-1"]

        def pull_messages(self, message_ids):
            return [Reply()]

    class Message:
        class metadata:  # pylint: disable=invalid-name
            message_id, dst_node_id = "id-1", 7

    class Reply:
        class metadata:  # pylint: disable=invalid-name
            reply_to_message_id = "id-1"

    with caplog.at_level("WARNING", logger="flwr"):
        for _ in range(2):
            replies = messaging.send_and_collect(Grid(), [Message()], timeout=1.0)
            assert len(replies) == 1 and isinstance(replies[0], Reply)
    assert caplog.text.count("object pull waits kept") == 1
    assert (
        inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"]
        == FLOWERS["initial_backoff"]
    )
