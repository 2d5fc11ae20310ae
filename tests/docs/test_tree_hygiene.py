"""The tree stays readable and speaks of the project only.

- no tracked Python file holds more than ``MAX_CODE_LINES`` lines of code (blank lines and comment-only
  lines not counted);
- no tracked text file speaks of how the project was developed (work sessions, device calls, a tracker
  issue, paths outside the repository).
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_CODE_LINES = 400
PROCESS_WORDS = re.compile(r"sessions? [0-9]|device calls?\b|\.\./shared|\bthe issue\b", re.IGNORECASE)
# files whose content is data, not prose: binaries and the shipped tokenizer's vocabulary
SKIP_SUFFIXES = {".safetensors", ".png", ".jpg", ".pt", ".bin"}
SKIP_FILES = {"specfold_compile/assets/specfold-tiny/tokenizer.json", "tests/docs/test_tree_hygiene.py"}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def code_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def test_code_lines_counts_code_only():
    assert code_lines("x = 1\n\n# a comment\n    y = 2  # trailing\n") == 2


def test_no_python_file_is_over_the_limit():
    long = {p: n for p in _tracked() if p.endswith(".py")
            if (n := code_lines((ROOT / p).read_text(errors="replace"))) > MAX_CODE_LINES}
    assert not long, f"over {MAX_CODE_LINES} lines of code: {long}"


def test_process_words_pattern_matches_what_it_should():
    assert PROCESS_WORDS.search("measured in Session 12")
    assert PROCESS_WORDS.search("one device call each")
    assert PROCESS_WORDS.search("see ../shared/SPEC.md")
    assert not PROCESS_WORDS.search("the session object; a device; an issue of the journal")


def test_no_tracked_file_speaks_of_the_development_process():
    hits = []
    for p in _tracked():
        if p in SKIP_FILES or Path(p).suffix in SKIP_SUFFIXES:
            continue
        for i, line in enumerate((ROOT / p).read_text(errors="replace").splitlines(), 1):
            if PROCESS_WORDS.search(line):
                hits.append(f"{p}:{i}")
    assert not hits, f"{len(hits)} lines speak of the development process, first: {hits[:20]}"
