"""An idle SuperNode's polls back off, and a message after an idle spell still starts soon.

Real processes: a SuperLink (debug logs: one line, with its time, for every
pull of every SuperNode) and 2 ``fedx-supernode``s with 0.1-s polls that
back off after 3 s to 2 s. The poll schedule is read from the SuperLink's
log, the latency of a message that comes after an idle spell from the
SuperLink's log (the ServerApp pushed it) and the SuperNode's (it received
it). The schedule itself (``fedx.flower.IdleBackoff``) is unit-tested in
tests/unit/test_flower_changes.py; ``benchmarks/idle_federation.py`` measures
what an idle fast-setup federation costs.
"""

import datetime
import re
import statistics
import time

import pytest

from tests.support.deployment import WIRE_APP, run_app, running, spec_on_free_ports

pytestmark = pytest.mark.cost(1)

INTERVAL, IDLE_AFTER, CEILING = 0.1, 3.0, 2.0
#: A line of Flower's debug log: its time (then a colour code, a colon), then the message.
STAMPED = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\S*:\s+([^\n]*)")


def stamped(text: str, message: str) -> list[float]:
    """The times (seconds) of the log lines whose message starts with ``message``."""
    return [
        datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for stamp, line in STAMPED.findall(text)
        if line.startswith(message)
    ]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_an_idle_supernode_backs_off_and_a_message_after_an_idle_spell_starts_within_the_ceiling(
    tmp_path,
):
    spec = spec_on_free_ports(
        2,
        tmp_path / "federation",
        insecure=True,
        poll_interval=INTERVAL,
        idle_after=IDLE_AFTER,
        max_poll_interval=CEILING,
        superlink_database="memory",
        workdir=tmp_path,
        extra_environment={"FLWR_LOG_LEVEL": "DEBUG"},
    )
    with running(spec) as federation:
        node = federation.node_id(0)
        time.sleep(IDLE_AFTER + 3 * CEILING + 4.0)  # backed off, then a few polls at the ceiling
        superlink_log = spec.log_dir / "superlink.log"
        pulls = stamped(superlink_log.read_text(), f"[Fleet.PullMessages] node_id={node}")
        # Idle: never a wait shorter than asked (so at most one pull per second at the end),
        # and no pull more than the ceiling (plus the time of a request) after the last.
        late = gaps(pulls[-4:])
        assert len(late) == 3, gaps(pulls)
        assert all(CEILING - 0.05 <= g <= CEILING + 1.0 for g in late), gaps(pulls)
        # Once connected it pulled often for a while: many more pulls than at the ceiling.
        early = [t for t in pulls if t < pulls[0] + IDLE_AFTER]
        assert len(early) >= 3 * IDLE_AFTER / CEILING, gaps(pulls)
        output = run_app(
            federation,
            WIRE_APP,
            "num-server-rounds=1 min-nodes=2 strategies='fedmr'",
            timeout=300,
        )
        assert "Traceback" not in output, output[-3000:]
    superlink_text = superlink_log.read_text()
    node_text = (spec.log_dir / "supernode-0.log").read_text()
    pushed = stamped(superlink_text, "Runtime.PushMessages")[0]  # the ServerApp's first message
    received = next(t for t in stamped(node_text, "Receiving: ") if t >= pushed - 0.01)
    pulls = stamped(superlink_text, f"[Fleet.PullMessages] node_id={node}")
    before = [t for t in pulls if t < pushed][-3:]
    # It came after an idle spell (the node pulled once a second) and started within the ceiling.
    assert min(gaps(before)) >= CEILING - 0.05, gaps(before)
    assert received - pushed <= CEILING + 1.0, (pushed, received)
    # After its reply the node pulls often again for a while (the next exchange of a run).
    replied = stamped(node_text, "Sent successfully")[-1]
    after = [t for t in pulls if replied < t < replied + IDLE_AFTER - 0.5]
    assert len(after) >= 3 and statistics.median(gaps(after)) < CEILING / 2, gaps(after)
