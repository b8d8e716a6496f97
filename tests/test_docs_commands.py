"""The shardsched commands that the README and docs/ show in their code blocks are commands this
version accepts: each is parsed by the real CLI (with ``--help`` appended, so nothing is run and no
file it names need exist) and must not be a usage error. A renamed or removed option then fails
here instead of in a reader's terminal."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardsched.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``shardsched``) for every shardsched command line of a code block."""
    out = []
    for path in DOCS:
        for block in _FENCE.findall(path.read_text()):
            text = block.replace("\\\n", " ")
            for line in text.splitlines():
                line = line.split(" #", 1)[0].strip()
                for part in re.split(r"&&|;", line):
                    part = part.strip()
                    if not part.startswith("shardsched "):
                        continue
                    part = part.split("|", 1)[0].split(">", 1)[0]
                    part = part.replace("[", "").replace("]", "")  # an optional part is shown in brackets
                    out.append((f"{path.relative_to(ROOT)}: {part.strip()}", shlex.split(part)[1:]))
    return out


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 8, COMMANDS  # the README's main job, bench, serve, simulate examples at least


@pytest.mark.parametrize("argv", [argv for _, argv in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_a_documented_command_is_accepted(argv):
    result = CliRunner().invoke(cli, [*argv, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
