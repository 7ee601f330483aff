"""No machine timings in fedx's comments and docstrings (issue 41, item 3).

A figure measured on one machine ("1.6-2.3 s on 2 cores", "took 11.4 s a
round") goes stale with the next machine or release: a comment keeps the
reason (what costs time, and why the code does what it does) and points to
where the figure is measured (a ``benchmarks/`` script, a section of
docs/results.md or docs/results-record.md). Settings (Flower's 3 s poll, its
30 s heartbeat, a backoff) and bounds computed from them are no timings.

The check: a comment or docstring line of ``fedx/`` holding a number with a
time unit and a word of a machine or a measurement ("cores", "machine",
"measured", "took", "idle", "under load", ...). Lines that match but quote a
setting are allowed one by one in :data:`ALLOWED`.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.support.helpers import REPO

FEDX = REPO / "fedx"

#: A number (or a range's last number) with a time unit: "3 s", "0.21 ms", "30 us", "10 seconds".
TIME = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*(?:s|ms|us|µs|seconds?|minutes?)(?!\w)")
#: Words that say a figure was measured on some machine.
MACHINE = re.compile(
    r"\b(?:cores?|machines?|measured|took|idle|under load|load average|median)\b", re.IGNORECASE
)

#: (file, part of the line): lines that match but quote settings, not timings.
ALLOWED = {
    # Flower's idle poll (3 s) and fedx's poll interval (0.1 s).
    ("fedx/deploy/supernode.py", "an idle node costs the SuperLink one pull per 3 s"),
    # Flower's SuperExec poll (up to 1 s once idle).
    ("fedx/deploy/spec.py", "# its task polls: up to Flower's 1 s once idle"),
    ("fedx/flower/message_feeder.py", "0.1 s: at 100 nodes and 100 messages"),
    ("fedx/flower/supernode_waits.py", "every node is idle, so every exchange started up to 3 s"),
    ("fedx/flower/supernode_waits.py", "fast setup (3 SuperNodes, 0.1 s)"),
    ("fedx/flower/supernode_waits.py", "idle (3 s) and reply (0.5 s) waits"),
}


def comment_lines(path: Path) -> dict[int, str]:
    """Line number -> text of every comment line and docstring line of a Python file."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string
    for node in ast.walk(ast.parse(source)):
        # Docstrings of modules, classes and functions, and attribute docstrings.
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                found[number] = lines[number - 1]
    return found


def timing_lines(path: Path) -> list[tuple[int, str]]:
    """The comment and docstring lines of ``path`` that look like a machine timing."""
    return [
        (number, text.strip())
        for number, text in sorted(comment_lines(path).items())
        if TIME.search(text) and MACHINE.search(text)
    ]


def test_no_machine_timings_in_comments():
    found = []
    for path in sorted(FEDX.rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        for number, text in timing_lines(path):
            if not any(name == file and part in text for file, part in ALLOWED):
                found.append(f"{name}:{number}: {text}")
    assert not found, (
        "machine timings in comments or docstrings (keep the reason, point to the benchmark "
        "or the docs section that measures it; a setting goes in ALLOWED):\n" + "\n".join(found)
    )


def test_the_allowed_lines_are_there():
    """Every entry of ALLOWED still matches a line it allows (else it goes)."""
    stale = []
    for file, part in sorted(ALLOWED):
        if not any(part in text for _, text in timing_lines(REPO / file)):
            stale.append(f"{file}: {part!r}")
    assert not stale, "ALLOWED entries that match no line any more:\n" + "\n".join(stale)


def test_the_check_finds_a_timing(tmp_path):
    """The check flags a measured figure in a comment and in a docstring, and not a setting."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Ray starts 1.6-2.3 s later on 2 cores."""\n'
        "\n"
        "# took 11.4 s a round that way\n"
        "POLL = 3.0  # Flower's 3 s poll\n"
        "#: The heartbeat goes out every 30 s.\n"
        "HEARTBEAT = 30\n",
        encoding="utf-8",
    )
    assert [number for number, _ in timing_lines(sample)] == [1, 3]
