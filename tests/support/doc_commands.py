"""Every command that README.md and docs/ show, read from the pages and checked against the code.

A page's commands are the lines of its shell blocks (fenced as ``bash``,
``sh``, ``shell`` or ``console``: continuation lines joined, ``&&``, ``;``,
``|`` and subshells split, ``for`` loops run once per value, here-documents
set aside) and its inline code spans that start with a tool's name and give
it an argument. :func:`check_page` checks each one:

* the tool and each flag exist: ``flwr`` through Flower's own command-line
  parser (click), ``fedx-deploy`` and ``fedx-compare`` through theirs
  (argparse), every other tool (``flower-superlink``, ``fedx-supernode``,
  ``sphinx-build``, ``pytest``, ``pip``, ``ray``, ``podman-compose``, the
  scripts under ``benchmarks/`` and ``docs/``, ``python -m`` modules) through
  its ``--help``, run once and kept on disk while the code and the installed
  packages stay the same (:class:`HelpTexts`);
* every file of the repository it names exists (globs match something;
  folders an earlier command of the page creates, with ``mkdir``, ``--out``
  or a virtualenv, may be missing);
* the run config of ``flwr run``, ``fedx-deploy up --run`` and
  ``fedx-compare`` is valid: the app's defaults with the file or the
  ``key=value`` overrides, through :meth:`fedx.config.RunConfig.from_mapping`
  (fedx-compare: its own plan); ``--federation-config`` through Flower's
  parser;
* the federation has the SuperNodes the run config waits for
  (``min-available-nodes``; ``leaf-users`` with ``natural`` partitioning):
  a local simulation's ``num-supernodes`` (Flower's default, 2, when not
  given), ``fedx-deploy up --supernodes``, fedx-compare's ``--num-supernodes``;
* ``pip install`` of the checkout names extras it has, and a block that
  installs fedx without the ``app`` extra runs none of the app's tools;
* a Python here-document compiles.

Placeholders (``<server>``, ``N``, ``$VAR`` with no value on the page) are
taken as written; ``...`` and ``[options]`` mark an elided rest, so such a
command's flags are checked but not what it leaves out.
"""

import contextlib
import glob
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import distributions
from importlib.util import find_spec
from itertools import product
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
#: Options whose value is something a command writes, not a file it reads.
OUTPUT_OPTIONS = {"--out", "--output", "-o", "-d", "--database", "--screenshot", "--state-dir"}
#: Suffixes of files a command reads from the repository.
REPO_SUFFIXES = {".py", ".toml", ".sh", ".md", ".yml", ".yaml", ".cfg", ".txt", ".json", ".csv"}
#: The tools of fedx's app extra (a block that installs fedx without it must not run them).
APP_TOOLS = {"fedx-deploy", "fedx-compare", "fedx-superexec", "fedx-supernode", "fedx-superlink"}
#: Tools checked through ``--help`` (the first word after the tool is a subcommand for these).
SUBCOMMAND_TOOLS = {"pip", "ray", "podman-compose"}
HELP_TOOLS = {
    "flower-superlink", "flower-supernode", "fedx-superexec", "fedx-supernode",
    "fedx-superlink", "sphinx-build", "pytest", "pip", "ray", "podman-compose",
}  # fmt: skip
#: Tools of the system or the shell: only the repository files they name are checked.
SYSTEM_TOOLS = {
    "apt-get", "mkdir", "ls", "echo", "chown", "pkill", "git", "tar", "cp", "mv", "rm", "cat",
    "nvidia-cuda-mps-control", "nvidia-smi", "export", "cd", "tee", "curl", "kill",
    "docker", "podman", "uv", "source", ".",
}  # fmt: skip
COMPOSE_FILE = REPO / "docker-compose.yml"
SHELL_KEYWORDS_OPEN = {"for", "while", "until", "if", "case", "select"}
SHELL_KEYWORDS_LEAD = {"do", "then", "else", "elif", "{", "!"}
SHELL_KEYWORDS_CLOSE = {"done", "fi", "esac", "}"}
OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}
REDIRECTIONS = {">", ">>", "<", ">&", "<&", "&>", "<<", "<<-", "<<<"}


@dataclass
class Command:
    """One command a page shows: its words (after the environment assignments), where, and how."""

    page: str
    line: int
    text: str
    argv: list[str]
    inline: bool
    env: dict[str, str] = field(default_factory=dict)
    #: The line of the block it is in (``None``: inline, in a sentence).
    block: int | None = None
    heredoc: str | None = None
    #: ``...`` or ``[...]`` stood for more arguments: what is given is checked, not what is left out.
    elided: bool = False
    #: The kinds of check this command went through (for the coverage summary).
    checks: list[str] = field(default_factory=list)

    @property
    def tool(self) -> str:
        return self.argv[0] if self.argv else ""

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


# ----------------------------------------------------------------------
# Reading the pages
# ----------------------------------------------------------------------


def doc_pages(root: Path = REPO) -> list[Path]:
    """README.md and every Markdown page under docs/ (whatever a later change adds), built site aside."""
    pages = [root / "README.md"]
    pages += sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts)
    return pages


def _fences(text: str) -> Iterator[tuple[int, int, str, str]]:
    """(first line of the code, line after the closing fence, language, code) of each fenced block."""
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)", lines[index])
        if not opening:
            index += 1
            continue
        fence = opening.group(2)
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        yield index + 1, end + 1, opening.group(3).lower(), "\n".join(lines[index + 1 : end])
        index = end + 1


def _strip_comment(line: str) -> str:
    """``line`` without its shell comment (a ``#`` that starts a word, outside quotes)."""
    quote = None
    for position, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position]
    return line


def _tokens(line: str) -> list[str]:
    """Shell words and operators; a ``<placeholder>`` stays inside its word."""
    hidden = re.sub(r"<([\w./:-]+)>", "\x00\\1\x01", line)
    lexer = shlex.shlex(hidden, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    return [word.replace("\x00", "<").replace("\x01", ">") for word in lexer]


def _is_placeholder(word: str) -> bool:
    return bool(re.search(r"<[^<>\s]+>", word)) or "$" in word or "..." in word


def _segments(tokens: list[str]) -> Iterator[list[str]]:
    """The simple commands of one line of tokens: split at operators, redirections dropped."""
    current: list[str] = []
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in OPERATORS:
            if current:
                yield current
            current = []
        elif token in REDIRECTIONS:
            if current and current[-1].isdigit():
                current.pop()  # the 2 of 2>&1
            skip_next = True
        else:
            current.append(token)
    if current:
        yield current


def _substitute(word: str, values: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        return values.get(match.group(1) or match.group(2), match.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)


def block_commands(page: str, first_line: int, code: str) -> list[Command]:
    """The commands of one shell block (see the module docstring)."""
    lines = code.split("\n")
    commands: list[Command] = []
    variables: dict[str, list[str]] = {}
    index = 0
    while index < len(lines):
        start = index
        text = _strip_comment(lines[index]).rstrip()
        while text.endswith("\\") and index + 1 < len(lines):
            index += 1
            text = text[:-1].rstrip() + " " + _strip_comment(lines[index]).strip()
        heredoc = None
        marker = re.search(r"<<-?\s*(['\"]?)(\w+)\1", text)
        if marker:
            body_end = index + 1
            while body_end < len(lines) and lines[body_end].strip() != marker.group(2):
                body_end += 1
            heredoc = "\n".join(lines[index + 1 : body_end])
            index = body_end
        index += 1
        if not text.strip():
            continue
        for words in _segments(_tokens(text)):
            while words and words[0] in SHELL_KEYWORDS_LEAD | SHELL_KEYWORDS_CLOSE:
                words = words[1:]
            if not words:
                continue
            if words[0] in SHELL_KEYWORDS_OPEN:
                if words[0] == "for" and len(words) >= 3 and words[2] == "in":
                    variables[words[1]] = words[3:]
                continue
            env = {}
            while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                name, value = words.pop(0).split("=", 1)
                env[name] = value
            if words and words[0] == "export":
                for word in words[1:]:
                    if "=" in word:
                        name, value = word.split("=", 1)
                        variables[name] = [value]
            if not words:
                for name, value in env.items():
                    variables[name] = [value]
                continue
            names = [
                name
                for name in variables
                if any(f"${name}" in w or f"${{{name}}}" in w for w in words)
            ]
            for combination in product(*(variables[name] for name in names)):
                values = dict(zip(names, combination, strict=True))
                argv = [_substitute(word, values) for word in words]
                commands.append(
                    Command(
                        page, first_line + start + 1, " ".join(map(shlex.quote, words)), argv,
                        inline=False, env=env, heredoc=heredoc if "<<" in text else None,
                        block=first_line, elided=_elided(argv),
                    )
                )  # fmt: skip
    return commands


def _elided(argv: list[str]) -> bool:
    return any("..." in word or word.startswith("[") for word in argv)


def _known_tool(word: str) -> bool:
    return (
        word in {"flwr", "fedx-deploy", "fedx-compare", "python", "python3", "python3.11", "bash"}
        or word in HELP_TOOLS
        or word in SYSTEM_TOOLS - {".", "cd", "export", "echo", "ls", "cat"}
    )


def inline_commands(page: str, text: str) -> list[Command]:
    """The code spans of ``text`` (fenced blocks aside) that are a tool with at least one argument."""
    blanked = text.split("\n")
    for first, after, _, _ in _fences(text):
        for number in range(first - 1, min(after, len(blanked))):
            blanked[number] = ""
    prose = "\n".join(blanked)
    commands = []
    for match in re.finditer(r"(?<!`)`([^`]+?)`(?!`)", prose, re.S):
        span = " ".join(match.group(1).split())
        try:
            words = _tokens(span)
        except ValueError:  # an unbalanced quote: prose, not a command
            continue
        env = {}
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if len(words) < 2 or not _known_tool(words[0]) or any(w in OPERATORS for w in words):
            continue
        line = prose.count("\n", 0, match.start()) + 1
        commands.append(
            Command(page, line, span, words, inline=True, env=env, elided=_elided(words))
        )
    return commands


def page_commands(page: Path, root: Path = REPO, text: str | None = None) -> list[Command]:
    """Every command of ``page`` (its text, or ``text`` in its place), in page order."""
    text = page.read_text() if text is None else text
    name = page.relative_to(root).as_posix() if page.is_relative_to(root) else page.name
    commands = []
    for first, _, language, code in _fences(text):
        if language in SHELL_LANGUAGES:
            commands += block_commands(name, first, code)
    commands += inline_commands(name, text)
    return sorted(commands, key=lambda c: c.line)


# ----------------------------------------------------------------------
# --help texts, kept on disk
# ----------------------------------------------------------------------


@cache
def _installed() -> bytes:
    """This interpreter and the packages installed for it."""
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions())
    return "\n".join([sys.executable, *names]).encode()


@cache
def _sources(pattern: str) -> bytes:
    digest = hashlib.sha256()
    for path in sorted(REPO.glob(pattern)):
        digest.update(path.as_posix().encode() + path.read_bytes())
    return digest.digest()


def _fingerprint(argv: tuple[str, ...]) -> str:
    """What ``argv --help`` depends on: the installed packages, and fedx's code or the script's."""
    digest = hashlib.sha256(_installed())
    digest.update("\0".join(argv).encode())
    if argv[0].startswith("fedx-") or argv[0] == "python":
        digest.update(_sources("fedx/**/*.py"))
    if argv[0] == "python" and argv[1].endswith(".py"):
        digest.update(_sources(f"{Path(argv[1]).parent.as_posix()}/*.py"))
    return digest.hexdigest()[:24]


class HelpTexts:
    """``--help`` of the tools the pages use: run once per code and environment, kept on disk.

    The folder is ``$XDG_CACHE_HOME/fedx/tests/help`` (else ``~/.cache/...``),
    one file per text, named by what the text depends on: a change to the
    installed packages, to fedx's code or to a script's folder makes new
    entries (:func:`_fingerprint`).
    """

    def __init__(self, folder: Path | None = None) -> None:
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        self.folder = folder or cache_home / "fedx" / "tests" / "help"
        self.texts: dict[tuple[str, ...], str] = {}
        #: How many --help processes this object started (the rest came from disk).
        self.started = 0

    def _file(self, argv: tuple[str, ...]) -> Path:
        return self.folder / f"{_fingerprint(argv)}.json"

    def _run(self, argv: tuple[str, ...]) -> str:
        environment = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
        # A page's `python -m <module>` of an example: its flags, as if installed
        # (whether the page installs it or puts it on the path is checked apart).
        examples = [str(p) for p in sorted((REPO / "examples").iterdir()) if p.is_dir()]
        environment["PYTHONPATH"] = os.pathsep.join(
            [*examples, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        executable = Path(sys.executable).parent / argv[0]
        command = [str(executable) if executable.exists() else argv[0], *argv[1:], "--help"]
        if argv[0] in {"python", "python3", "python3.11"}:
            command[0] = sys.executable
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=300, check=False,
                env=environment, cwd=REPO,
            )  # fmt: skip
        except FileNotFoundError:
            return ""
        self.started += 1
        return done.stdout + done.stderr if done.returncode == 0 else ""

    def prepare(self, wanted: Iterable[tuple[str, ...]]) -> None:
        """Fetch every --help of ``wanted`` not on disk yet, a few processes at a time."""
        missing = []
        for argv in set(wanted):
            path = self._file(argv)
            if path.exists():
                self.texts[argv] = json.loads(path.read_text())["help"]
            else:
                missing.append(argv)
        with ThreadPoolExecutor(4) as pool:
            for argv, text in zip(missing, pool.map(self._run, missing), strict=True):
                self.texts[argv] = text
                if text:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    self._file(argv).write_text(json.dumps({"argv": argv, "help": text}))

    def options(self, argv: tuple[str, ...]) -> set[str] | None:
        """The options ``argv --help`` lists; ``None`` when it gave no help (no such tool)."""
        if argv not in self.texts:
            self.prepare([argv])
        text = self.texts[argv]
        if not text:
            return None
        return set(re.findall(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)", text))


def help_key(command: Command) -> tuple[str, ...] | None:
    """Which ``--help`` checks ``command``'s flags: the tool, its subcommand or its script."""
    argv = command.argv
    tool = argv[0]
    if tool in {"python", "python3", "python3.11"}:
        if len(argv) > 2 and argv[1] == "-m" and argv[2] != "venv":
            return ("python", "-m", argv[2])
        if len(argv) > 1 and argv[1].endswith(".py"):
            return ("python", argv[1].removeprefix("./"))
        return None
    if tool in SUBCOMMAND_TOOLS:
        positional = [w for w in argv[1:] if not w.startswith("-")]
        if tool == "podman-compose":
            return ("podman-compose",)  # its subcommands: checked on their own
        return (tool, positional[0]) if positional else (tool,)
    return (tool,) if tool in HELP_TOOLS else None


# ----------------------------------------------------------------------
# Checking
# ----------------------------------------------------------------------


def _flags(words: Iterable[str]) -> list[str]:
    flags = []
    for word in words:
        if word == "--":
            break
        if re.match(r"^--?[A-Za-z]", word):
            flags.append(word.split("=", 1)[0])
    return flags


@cache
def _flwr_cli():
    import typer  # pylint: disable=import-outside-toplevel
    from flwr.cli.app import app  # pylint: disable=import-outside-toplevel

    return typer.main.get_command(app)


def _argparse(parser, argv: list[str]) -> tuple[Any, str | None]:
    """``parser.parse_args(argv)``, or its error message."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parser.parse_args(argv), None
        except SystemExit:
            return None, errors.getvalue().strip().splitlines()[-1]


def _app_config(app_dir: Path) -> dict[str, Any] | None:
    pyproject = app_dir / "pyproject.toml"
    if not pyproject.exists():
        return None
    return tomllib.loads(pyproject.read_text()).get("tool", {}).get("flwr", {}).get("app")


@contextlib.contextmanager
def _plugins_of(page_installs: set[str]) -> Iterator[None]:
    """The methods, data sets and models of the example packages a page installs
    (``pip install ./examples/<x>``), registered while a run config that names them is
    checked, as installing them would."""
    from fedx import registry  # pylint: disable=import-outside-toplevel

    groups = {
        registry.ENTRY_POINT_GROUP: registry._REGISTRY._registered,  # pylint: disable=protected-access
        registry.DATASET_GROUP: registry._REGISTERED_COMPONENTS[registry.DATASET_GROUP],  # pylint: disable=protected-access
        registry.MODEL_GROUP: registry._REGISTERED_COMPONENTS[registry.MODEL_GROUP],  # pylint: disable=protected-access
    }
    added: list[tuple[dict, str]] = []
    for folder in sorted(page_installs):
        project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())
        entry_points = project.get("project", {}).get("entry-points", {})
        for group, registered in groups.items():
            for name, target in entry_points.get(group, {}).items():
                module_name, attribute = target.split(":")
                with _on_path([str(REPO / folder)]):
                    module = __import__(module_name, fromlist=[attribute])
                # The registry's in-process registrations, undone afterwards (the
                # public register() has no undo: tests would see the plug-in).
                if name not in registered:
                    registered[name] = getattr(module, attribute)
                    added.append((registered, name))
    try:
        yield
    finally:
        for registered, name in added:
            registered.pop(name)


@contextlib.contextmanager
def _on_path(folders: list[str]) -> Iterator[None]:
    """``folders`` on the import path for the block (and modules they hold forgotten after it)."""
    before = set(sys.modules)
    sys.path[:0] = folders
    try:
        yield
    finally:
        del sys.path[: len(folders)]
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if any(str(getattr(module, "__file__", "") or "").startswith(f) for f in folders):
                del sys.modules[name]


def check_run_config(
    app: str, overrides: list[str], supernodes: int | None, plugins: set[str]
) -> list[str]:
    """Problems of running fedx's app at ``app`` with ``overrides`` on ``supernodes`` nodes.

    ``overrides`` as ``--run-config`` takes them (one TOML file, or
    ``key=value`` strings); ``supernodes`` ``None`` when the federation's size
    is not known from the command (a named deployment).
    """
    from flwr.common.config import parse_config_args  # pylint: disable=import-outside-toplevel

    from fedx.config import ConfigError, RunConfig  # pylint: disable=import-outside-toplevel

    app_dir = (REPO / app).resolve()
    config = _app_config(app_dir)
    if config is None:
        return [f"{app} is not a Flower app (no [tool.flwr.app] in {app}/pyproject.toml)"]
    if app_dir != REPO or any(_is_placeholder(o) for o in overrides):
        return []  # another app's keys are its own; a placeholder is the reader's to fill in
    problems = []
    files = [o for o in overrides if o.endswith(".toml")]
    for name in files:
        if not (REPO / name).exists():
            return [f"run-config file {name} does not exist"]
    try:
        with contextlib.chdir(REPO):
            given = parse_config_args(overrides or None)
    except (ValueError, OSError) as err:
        return [f"--run-config {' '.join(overrides)}: {err}"]
    except Exception as err:  # click's exception for a malformed key=value string
        return [f"--run-config {' '.join(overrides)}: {getattr(err, 'message', err)}"]
    try:
        with _plugins_of(plugins):
            checked = RunConfig.from_mapping({**config.get("config", {}), **given})
    except ConfigError as err:
        return [f"run config: {err}"]
    if supernodes is not None:
        problems += nodes_problems(checked, supernodes)
    return problems


def nodes_problems(config: Any, supernodes: int) -> list[str]:
    """The federation's ``supernodes`` against what ``config`` (a RunConfig) waits for."""
    problems = []
    if supernodes < config.min_available_nodes:
        problems.append(
            f"the run waits for min-available-nodes={config.min_available_nodes} SuperNodes, "
            f"the federation has {supernodes}"
        )
    if config.partitioning == "natural" and config.leaf_users and supernodes > config.leaf_users:
        problems.append(
            f"partitioning='natural' makes {config.leaf_users} clients (leaf-users), "
            f"the federation has {supernodes} SuperNodes"
        )
    return problems


@dataclass
class PageState:
    """What the commands of a page have done so far: folders made, how fedx was installed."""

    created: set[str] = field(default_factory=set)
    #: The extras the last ``pip install`` of this checkout named in the current block.
    fedx_extras: set[str] | None = None
    #: Example plug-ins the page installs.
    plugins: set[str] = field(default_factory=set)


class Checker:
    """Checks the commands of the pages against the code (see the module docstring)."""

    def __init__(self, helps: HelpTexts) -> None:
        self.helps = helps
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        self.extras = set(project.get("optional-dependencies", {}))
        self.services = _compose_services()

    # -- files --------------------------------------------------------

    def _paths(self, command: Command, state: PageState) -> list[str]:
        problems = []
        words = command.argv if "/" in command.tool else command.argv[1:]
        checked = False
        for previous, word in zip(["", *words], words, strict=False):
            value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
            if previous in OUTPUT_OPTIONS or not _repo_path(value) or _under(value, state.created):
                continue
            checked = True
            if glob.has_magic(value):
                if not glob.glob(str(REPO / value)):
                    problems.append(f"no file matches {value}")
            elif not (REPO / value).exists():
                problems.append(f"{value} does not exist")
        if checked:
            command.checks.append("files")
        return problems

    # -- flags, through the tool's own parser or its --help ------------

    def _help_flags(self, command: Command, key: tuple[str, ...], words: list[str]) -> list[str]:
        options = self.helps.options(key)
        if options is None:
            return [f"`{' '.join(key)} --help` fails: no such tool or script"]
        command.checks.append("--help")
        unknown = [flag for flag in _flags(words) if flag not in options]
        return [f"`{' '.join(key)}` has no option {flag}" for flag in unknown]

    def check(self, command: Command, state: PageState) -> list[str]:
        """The problems of one command; it also updates ``state`` (folders it creates, installs)."""
        argv = command.argv
        tool = argv[0]
        if tool == "sudo":
            argv = command.argv = argv[1:]
            tool = argv[0]
        if tool.startswith("/"):  # a tool by its absolute path: /opt/venv/bin/pip
            argv = command.argv = [Path(tool).name, *argv[1:]]
            tool = argv[0]
        self._note_created(command, state)
        problems = self._paths(command, state)
        if tool == "flwr":
            problems += self._flwr(command, state)
        elif tool in {"fedx-deploy", "fedx-compare"}:
            problems += self._fedx_tool(command, state)
        elif tool in {"python", "python3", "python3.11"}:
            problems += self._python(command, state)
        elif tool == "pip":
            problems += self._pip(command, state)
        elif tool == "pytest":
            problems += self._pytest(command)
        elif tool in {"podman-compose", "docker"}:
            problems += self._compose(command, state)
        elif tool in HELP_TOOLS:
            words = argv[2:] if tool in SUBCOMMAND_TOOLS else argv[1:]
            problems += self._help_flags(command, help_key(command), words)
            if tool == "sphinx-build":
                sources = [w for w in argv[1:] if not w.startswith("-")]
                if sources and not (REPO / sources[0] / "conf.py").exists():
                    problems.append(f"{sources[0]} has no conf.py")
        elif tool in {"bash", "sh"}:
            command.checks.append("files")
        elif "/" in tool:
            if not os.access(REPO / tool, os.X_OK):
                problems.append(f"{tool} is not an executable file of the repository")
            command.checks.append("files")
        elif tool not in SYSTEM_TOOLS:
            problems.append(f"unknown tool {tool!r}: check it here (tests/support/doc_commands.py)")
        if tool in APP_TOOLS or (tool == "flwr" and argv[1:2] == ["run"]):
            if state.fedx_extras is not None and not state.fedx_extras & {"app", "dev"}:
                problems.append(
                    f"{tool} needs fedx's app extra, but the block installs fedx without it"
                )
        return problems

    def _note_created(self, command: Command, state: PageState) -> None:
        argv = command.argv
        if argv[0] == "mkdir":
            state.created |= {w for w in argv[1:] if not w.startswith("-")}
        if argv[0].startswith("python") and argv[1:3] == ["-m", "venv"] and len(argv) > 3:
            state.created.add(argv[-1])
        if argv[0] == "sphinx-build":
            positional = [w for w in argv[1:] if not w.startswith("-")]
            state.created |= set(positional[1:2])
        for option, value in zip(argv, argv[1:], strict=False):
            if option in OUTPUT_OPTIONS:
                state.created.add(value)

    def _flwr(self, command: Command, state: PageState) -> list[str]:
        import click  # pylint: disable=import-outside-toplevel

        group = _flwr_cli()
        words = command.argv[1:]
        names = []
        while words and isinstance(group, click.Group):
            if words[0] not in group.commands:
                return [f"flwr has no command {' '.join([*names, words[0]])!r}"]
            names.append(words[0])
            group = group.commands[words.pop(0)]
        if isinstance(group, click.Group):
            return []  # `flwr supernode`: a group named in prose
        command.checks.append("flwr's parser")
        try:
            context = group.make_context(" ".join(names), list(words), resilient_parsing=False)
        except click.MissingParameter:
            if command.inline or command.elided:
                return []  # a command named in prose, not all of it
            raise
        except click.UsageError as err:
            return [f"flwr {' '.join(names)}: {err.format_message()}"]
        if names != ["run"]:
            return []
        params = context.params
        overrides = list(params.get("run_config_overrides") or [])
        federation = list(params.get("federation_config_overrides") or [])
        problems = []
        supernodes = None
        if federation and not any(_is_placeholder(f) for f in federation):
            problems += _federation_config(federation)
        if params.get("superlink") is None and not command.elided:
            # No SuperLink connection named: Flower's local simulation.
            supernodes = _simulated_supernodes(federation)
        app = params["app"]
        if app.startswith("@") or _is_placeholder(app):
            return problems
        command.checks.append("run config")
        if supernodes is not None:
            command.checks.append("SuperNodes")
        return problems + check_run_config(app, overrides, supernodes, state.plugins)

    def _fedx_tool(self, command: Command, state: PageState) -> list[str]:
        tool, words = command.argv[0], command.argv[1:]
        if tool == "fedx-deploy":
            from fedx.deploy.cli import _parser  # pylint: disable=import-outside-toplevel
        else:
            from fedx.compare.cli import _parser  # pylint: disable=import-outside-toplevel
        parser = _parser()
        command.checks.append(f"{tool}'s parser")
        if command.inline or command.elided:
            return self._argparse_flags(parser, tool, words)
        words = [m for w in words for m in (sorted(glob.glob(w, root_dir=REPO)) or [w])]
        args, error = _argparse(parser, words)
        if error:
            return [f"{tool}: {error}"]
        if tool == "fedx-deploy":
            if args.command != "up" or not args.run:
                return []
            command.checks += ["run config", "SuperNodes"]
            overrides = [args.run_config] if args.run_config else []
            return check_run_config(args.run, overrides, args.supernodes, state.plugins)
        return self._compare_plan(command, args)

    def _argparse_flags(self, parser, tool: str, words: list[str]) -> list[str]:
        """The flags of a partial command (prose, or ``...``) against the parser's options."""
        import argparse  # pylint: disable=import-outside-toplevel

        options = set(parser._option_string_actions)  # pylint: disable=protected-access
        positional = [w for w in words if not w.startswith("-")]
        for action in parser._actions:  # pylint: disable=protected-access
            if isinstance(action, argparse._SubParsersAction) and positional:  # pylint: disable=protected-access
                sub = action.choices.get(positional[0])
                if sub is None:
                    return [f"{tool} has no command {positional[0]!r}"]
                options |= set(sub._option_string_actions)  # pylint: disable=protected-access
        return [f"{tool} has no option {flag}" for flag in _flags(words) if flag not in options]

    def _compare_plan(self, command: Command, args) -> list[str]:
        from fedx.compare.plan import Setting, app_defaults, plan_runs  # pylint: disable=import-outside-toplevel
        from fedx.config import ConfigError, RunConfig  # pylint: disable=import-outside-toplevel
        from fedx.registry import comma_list  # pylint: disable=import-outside-toplevel

        command.checks += ["run config", "SuperNodes"]
        try:
            settings = [Setting.load(REPO / path) for path in args.settings]
            runs = plan_runs(
                settings, list(comma_list(args.methods)), args.seeds, dict(args.overrides),
                app_defaults(REPO), REPO / "comparisons" / "check", args.num_supernodes,
            )  # fmt: skip
        except (ConfigError, OSError) as err:
            return [f"fedx-compare: {err}"]
        problems = []
        for run in runs:
            config = RunConfig.from_mapping(run.run_config)
            problems += [f"{run.label}: {p}" for p in nodes_problems(config, run.num_supernodes)]
        return sorted(set(problems))

    def _python(self, command: Command, state: PageState) -> list[str]:
        argv = command.argv
        if argv[1:2] == ["-"]:
            if command.heredoc is None:
                return []
            command.checks.append("compiles")
            try:
                compile(command.heredoc, f"{command.page}:{command.line}", "exec")
            except SyntaxError as err:
                return [f"the Python it reads does not compile: {err}"]
            return []
        if argv[1:3] == ["-m", "venv"]:
            return []
        if argv[1:2] == ["-m"] and len(argv) > 2:
            # An example's module, where the page put it: installed, or on PYTHONPATH.
            folders = [str(REPO / folder) for folder in sorted(state.plugins)]
            folders += [str(REPO / p) for p in command.env.get("PYTHONPATH", "").split(":") if p]
            with _on_path(folders):
                try:
                    found = find_spec(argv[2]) is not None
                except ModuleNotFoundError:  # its package is not there
                    found = False
            if not found:
                return [f"no module {argv[2]}"]
            return self._help_flags(command, ("python", "-m", argv[2]), argv[3:])
        key = help_key(command)
        if key is None:
            return []
        return self._help_flags(command, key, argv[2:])

    def _pip(self, command: Command, state: PageState) -> list[str]:
        argv = command.argv
        problems = self._help_flags(command, help_key(command), argv[2:])
        if argv[1:2] != ["install"]:
            return problems
        for word in argv[2:]:
            if word.startswith("-") or word.startswith("http"):
                continue
            match = re.match(r"^(\.|\./[^\[]*|[\w./-]+/)(?:\[([\w,-]+)\])?$", word)
            if not match:
                continue
            folder = REPO / match.group(1)
            if not (folder / "pyproject.toml").exists():
                problems.append(f"{match.group(1)} is not a Python project of the repository")
                continue
            extras = set((match.group(2) or "").split(",")) - {""}
            if folder.resolve() == REPO:
                unknown = extras - self.extras
                problems += [f"fedx has no extra {extra!r}" for extra in sorted(unknown)]
                state.fedx_extras = extras
            else:
                state.plugins.add(folder.resolve().relative_to(REPO).as_posix())
        return problems

    def _pytest(self, command: Command) -> list[str]:
        argv = command.argv
        problems = self._help_flags(command, ("pytest",), argv[1:])
        files = [REPO / w.split("::")[0] for w in argv[1:] if w.startswith("tests/")]
        pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
        markers = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
        for option, value in zip(argv, argv[1:], strict=False):
            if option == "-k" and files and all(f.exists() for f in files):
                tests = {n for f in files for n in re.findall(r"def (test_\w+)", f.read_text())}
                if not any(value in name for name in tests):
                    problems.append(f"-k {value} selects no test of {', '.join(map(str, files))}")
            if option == "-m":
                names = set(re.findall(r"\w+", value)) - {"not", "and", "or"}
                problems += [f"no pytest marker {n!r}" for n in sorted(names - markers)]
        return problems

    def _compose(self, command: Command, state: PageState) -> list[str]:
        """podman-compose and docker compose: the compose options, the service, and its command."""
        argv = command.argv
        words = argv[2:] if argv[0] == "docker" else argv[1:]
        if argv[0] == "docker" and argv[1:2] != ["compose"]:
            return []
        problems = self._help_flags(command, ("podman-compose",), _before_subcommand(words))
        rest = words[len(_before_subcommand(words)) :]
        if not rest:
            return problems
        subcommand, rest = rest[0], rest[1:]
        if subcommand != "run":
            problems += self._help_flags(command, ("podman-compose", subcommand), rest)
            return problems
        # `run [options] SERVICE [COMMAND...]`: the options up to the service are compose's.
        at = next((i for i, w in enumerate(rest) if not w.startswith("-")), None)
        problems += self._help_flags(command, ("podman-compose", "run"), rest[:at])
        if at is None:
            return problems + ["compose run names no service"]
        service, inner = rest[at], rest[at + 1 :]
        entrypoint = self.services.get(service)
        if entrypoint is None:
            return problems + [f"{COMPOSE_FILE.name} has no service {service!r}"]
        command.checks.append("compose service")
        if entrypoint in {"flwr", "fedx-deploy"} and inner:
            nested = Command(
                command.page, command.line, command.text, [entrypoint, *inner], command.inline,
                elided=command.elided,
            )  # fmt: skip
            if entrypoint == "flwr" and inner[0] == "run":
                # In the tools' container `flwr run .` goes to the compose SuperLink: its size
                # is the compose file's, not a local simulation's.
                nested.argv = [*nested.argv[:3], "fedx-compose", *nested.argv[3:]]
            problems += self.check(nested, state)
            command.checks += nested.checks
        return problems


def _before_subcommand(words: list[str]) -> list[str]:
    """The compose options before its subcommand (``--parallel 1``, ``--profile tools``)."""
    taken = []
    index = 0
    while index < len(words) and words[index].startswith("-"):
        taken.append(words[index])
        if "=" not in words[index] and index + 1 < len(words):
            index += 1
            taken.append(words[index])
        index += 1
    return taken


def _compose_services() -> dict[str, str]:
    """Each service of docker-compose.yml, with the program its entrypoint runs."""
    services: dict[str, str] = {}
    current = None
    for line in COMPOSE_FILE.read_text().splitlines():
        name = re.match(r"^  ([\w-]+):\s*$", line)
        if name:
            current = name.group(1)
            services[current] = ""
        entry = re.match(r"^    entrypoint:\s*\[(.*)\]", line)
        if entry and current:
            services[current] = [p.strip() for p in entry.group(1).split(",")][-1]
    return services


def _repo_path(word: str) -> bool:
    """Whether ``word`` names a file of the repository (a relative path to something kept there)."""
    if not word or _is_placeholder(word) or word.startswith(("/", "~", "-")) or "://" in word:
        return False
    if "=" in word or ":" in word or word in {".", ".."}:
        return False
    clean = word.removeprefix("./")
    first = clean.split("/")[0]
    has_suffix = Path(clean).suffix in REPO_SUFFIXES
    if "/" not in clean and not has_suffix:
        return False
    return (REPO / first).exists() or has_suffix


def _under(word: str, created: set[str]) -> bool:
    clean = word.removeprefix("./").rstrip("/")
    return any(clean == c.rstrip("/") or clean.startswith(c.rstrip("/") + "/") for c in created)


def _federation_config(overrides: list[str]) -> list[str]:
    from flwr.common.config import parse_config_args  # pylint: disable=import-outside-toplevel
    from flwr.supercore.utils import simulation_config_from_json  # pylint: disable=import-outside-toplevel

    try:
        values = parse_config_args(overrides)
        simulation_config_from_json({k.replace("-", "_"): v for k, v in values.items()})
    except Exception as err:  # pylint: disable=broad-exception-caught
        return [f"--federation-config {' '.join(overrides)}: {err}"]
    return []


def _simulated_supernodes(overrides: list[str]) -> int:
    """The SuperNodes of Flower's local simulation for these ``--federation-config`` values."""
    from flwr.common.config import parse_config_args  # pylint: disable=import-outside-toplevel
    from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG  # pylint: disable=import-outside-toplevel

    given = parse_config_args(overrides) if overrides else {}
    return int(given.get("num-supernodes", DEFAULT_SIMULATION_CONFIG.num_supernodes))


def check_page(commands: list[Command], checker: Checker) -> list[str]:
    """Every problem of a page's commands, each naming the page, the line and the command."""
    state = PageState()
    problems = []
    block = None
    for command in commands:
        if command.block != block:
            block = command.block
            state.fedx_extras = None  # what a block installed counts in that block
        for problem in checker.check(command, state):
            problems.append(f"{command.where()}\n    -> {problem}")
    return problems


def help_keys(commands: Iterable[Command]) -> set[tuple[str, ...]]:
    """The --help texts these commands need (to fetch them all at once, in parallel)."""
    keys = set()
    for command in commands:
        argv = command.argv[1:] if command.argv[0] == "sudo" else command.argv
        if argv[0].startswith("/"):
            argv = [Path(argv[0]).name, *argv[1:]]
        key = help_key(Command(command.page, command.line, command.text, argv, command.inline))
        if key is not None:
            keys.add(key)
        if argv[0] in {"podman-compose", "docker"}:
            words = argv[2:] if argv[0] == "docker" else argv[1:]
            rest = words[len(_before_subcommand(words)) :]
            if rest:
                keys.add(("podman-compose", rest[0]))
    return keys


__all__ = [
    "Checker",
    "Command",
    "HelpTexts",
    "check_page",
    "doc_pages",
    "help_keys",
    "page_commands",
]
