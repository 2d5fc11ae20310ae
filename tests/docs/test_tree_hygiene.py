"""The tree stays readable and speaks of the project only.

- no tracked Python file holds more than ``MAX_CODE_LINES`` lines of code (blank lines and comment-only
  lines not counted);
- no tracked text file speaks of how the project was developed (work sessions, device calls, a tracker
  issue, paths outside the repository);
- the test suite has one configuration and one helper module: a single ``tests/conftest.py``, shared
  helpers in ``specfold_compile/testing.py`` (``rel_err`` defined there only), imports resolved from the
  repository root (nothing in ``tests/`` or ``bench/`` touches the import path), and the package's own
  modules imported plainly (a broken package fails its tests instead of skipping them).
"""

import os
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
SYS_PATH = re.compile(r"\bsys\s*\.\s*path\b|\bfrom\s+sys\s+import\s+[^\n]*\bpath\b")
REL_ERR_DEF = re.compile(r"^\s*def\s+rel_err\s*\(", re.MULTILINE)
OWN_IMPORTORSKIP = re.compile(r"importorskip\(\s*[\"']specfold_compile")
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache"}
ME = Path(__file__).resolve()  # this file names the patterns it looks for


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


def _python_files(*parts: str) -> list[Path]:
    """The .py files under ROOT/parts (the whole tree without parts), outside environments and caches."""
    found = []
    for here, dirs, files in os.walk(ROOT.joinpath(*parts)):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(here) / f for f in files if f.endswith(".py")]
    return sorted(found)


def test_hygiene_patterns_match_what_they_should():
    assert SYS_PATH.search("sys.path.insert(0, here)") and SYS_PATH.search("sys .path[:0] = [x]")
    assert SYS_PATH.search("from sys import argv, path")
    assert not SYS_PATH.search("sys.argv; os.path.join(a, b); PYTHONPATH=.")
    assert len(REL_ERR_DEF.findall("def rel_err(a, b):\n    pass\n    def rel_err (x):\n")) == 2
    assert not REL_ERR_DEF.search("rel_err = _testing.rel_err\nx = rel_err(a, b)\ndef rel_error(a):")
    assert OWN_IMPORTORSKIP.search("m = pytest.importorskip('specfold_compile.models')")
    assert not OWN_IMPORTORSKIP.search('pytest.importorskip("transformers")')


def test_one_conftest_for_the_whole_suite():
    found = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("conftest.py"))
    assert found == ["tests/conftest.py"], found


def test_tests_and_benchmarks_leave_the_import_path_alone():
    """Imports resolve from the repository root (pytest's rootdir, ``python -m``, ``pythonpath`` in
    pyproject.toml), never by editing the path in code."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in _python_files("tests") + _python_files("bench") if p != ME
            for i, line in enumerate(p.read_text().splitlines(), 1) if SYS_PATH.search(line)]
    assert not hits, f"import path edited at {hits}"


def test_rel_err_is_defined_once_in_specfold_compile_testing():
    defs = [p for p in _tracked() if p.endswith(".py")  # (git-ignored scratch copies are not the project's)
            for _ in REL_ERR_DEF.findall((ROOT / p).read_text(errors="replace"))]
    assert defs == ["specfold_compile/testing.py"], defs


def test_no_test_skips_when_the_package_itself_fails_to_import():
    hits = [str(p.relative_to(ROOT)) for p in _python_files("tests")
            if p != ME and OWN_IMPORTORSKIP.search(p.read_text())]
    assert not hits, f"importorskip of the package's own modules in {hits}"
