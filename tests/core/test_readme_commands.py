"""Every command the README shows is checked: it must exist and take the flags it is shown with.

The README is what a new user copies from, so a renamed flag or a moved script must fail here, not on
their machine. ``openclaw-rl …`` lines are parsed by the real argument parser (nothing is started);
``bash scripts/…`` and ``python scripts/…`` must name a file of the repository that parses (``bash -n``,
``py_compile``). What these commands do is covered elsewhere: ``scripts/run_tests.sh`` is CI itself,
``scripts/run_local.sh`` is ``local --simulate`` (tests/learning), the launch scripts' dry runs are the
golden tests in tests/slime_plugins/test_launch_scripts.py, ``scripts/openclaw_chat_demo.sh`` is
tests/learning/test_openclaw_real.py. ``curl`` and ``cd`` lines are not commands of this project.
"""

from __future__ import annotations

import py_compile
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from openclaw_rl.cli import _command_of, build_parser

REPO = Path(__file__).resolve().parents[2]
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def readme_commands(text: str) -> list[list[str]]:
    """The shell commands of the README's ```bash blocks: continuations joined, comments and a trailing
    ``&`` dropped, each side of ``&&`` / ``|`` a command of its own, leading ``VAR=value`` stripped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and words[-1] == "&":
                words.pop()
            part: list[str] = []
            for word in [*words, "&&"]:
                if word in ("&&", "|", "||", ";"):
                    while part and _ENV.match(part[0]):
                        part.pop(0)
                    if part:
                        commands.append(part)
                    part = []
                elif not re.match(r"^\d*[<>]", word):  # a redirection (`2>&1`, `> log`) is the shell's
                    part.append(word)
    return commands


COMMANDS = readme_commands((REPO / "README.md").read_text())


def _id(words: list[str]) -> str:
    return " ".join(words)[:60]


def test_the_readme_has_commands_of_each_kind() -> None:
    programs = {Path(w[0]).name for w in COMMANDS}
    assert {"bash", "openclaw-rl"} <= programs, programs


def test_the_extraction_splits_and_strips_as_a_shell_would() -> None:
    text = "```bash\nA=1 bash x.sh --y \\\n  --z  # note\nopenclaw-rl a 2>&1 | head && b &\n```\n"
    assert readme_commands(text) == [["bash", "x.sh", "--y", "--z"], ["openclaw-rl", "a"], ["head"], ["b"]]


@pytest.mark.parametrize("words", [w for w in COMMANDS if Path(w[0]).name == "openclaw-rl"], ids=_id)
def test_each_openclaw_rl_command_parses(words: list[str]) -> None:
    args = words[1:]
    try:
        build_parser(_command_of(args)).parse_args(args)
    except SystemExit as e:  # argparse's way to refuse: an unknown flag, a bad choice, a missing value
        pytest.fail(f"README command `{' '.join(words)}` is refused by the parser (exit {e.code})")


@pytest.mark.parametrize("words", [w for w in COMMANDS if w[0] in ("bash", "python", "python3")
                                   and len(w) > 1 and "scripts/" in w[1]], ids=_id)
def test_each_script_the_readme_runs_exists_and_parses(words: list[str]) -> None:
    script = words[1]
    if not script.startswith("scripts/"):  # e.g. `bash /path/to/openclaw-rl/scripts/…`: the same file
        script = script[script.index("scripts/"):]
    path = REPO / script
    assert path.is_file(), f"README runs {script}, which does not exist"
    if words[0] == "bash":
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    else:
        py_compile.compile(str(path), doraise=True)


def test_every_file_the_readme_links_exists() -> None:
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(((?:docs|scripts|configs)/[^)#]+)", text) + re.findall(r'src="([^"]+)"', text)
    assert targets
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, missing
