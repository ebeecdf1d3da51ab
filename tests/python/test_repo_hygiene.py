"""Repository hygiene: what a user reads names current facts, not how the project got there.

Every tracked text file (`git ls-files`) is scanned for
  * the project's internal work history: numbered work sittings ("session" or "sitting" and a number), issue
    numbers ("issue" and a number, "issues" and a list), numbered benchmark passes ("pass" and a number, or an
    ordinal from "third" on, or "13th", before "pass");
  * paths outside the repository: the design notes the project was specified from (their file names below) and
    the folder they live in, reached through a relative path to a "shared" folder or a "spec" folder;
  * a build machine's absolute paths (under /work, /root, /tmp or /home).
A figure in the docs is named by what it measures, its host, date and command; a code comment names the docs
section that holds it.

What ordinary English may still say, and the rules leave alone: "passes the learning rate", "a pass over the
block", "two passes", "the first (or second) pass" of a loop, "N passed, N failed", "an issue tracker".

Exclusions, each narrow:
  * binary files (a NUL byte in their first 8 KiB: the PNG charts, the golden checkpoints under tests/data/) are
    not text a reader greps; their generators are scanned;
  * nothing else. CHANGELOG.md names versions ("0.3"), which no rule here matches.
"""
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_ORDINALS = ("third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
             "fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)")

# (rule name, compiled pattern). The patterns are written so that this file matches none of them.
RULES = (
    ("a numbered work sitting", re.compile(r"\b(?:session|sitting)s?\s+#?\d+", re.I)),
    ("an issue number", re.compile(r"\bissues?\s+#?\d+", re.I)),
    ("a numbered pass", re.compile(r"\bpass\s+#?\d+\b(?!\.\d)", re.I)),
    ("an ordinal pass", re.compile(r"\b(?:" + _ORDINALS + r")\s+pass(?:es)?\b", re.I)),
    ("a design note outside the repository",
     re.compile(r"\b(?:ALGORITHMS|ANCHORS|STYLE|ABI)\.md\b")),
    ("a path outside the repository", re.compile(r"\.\./shared\b|(?<![\w./-])(?:shared/)?spe[c]/")),
    ("a build machine's absolute path", re.compile(r"(?<![\w.~-])/(?:work|root|tmp|home)/")),
)


def violations(text):
    """[(line number, rule, matched text)] of one file's text."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern in RULES:
            for m in pattern.finditer(line):
                found.append((number, name, m.group(0)))
    return found


def _tracked_files():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the rules apply to the repository's tracked files")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def _text(path):
    """The file's text, or None for a binary file (or one gone from the working tree)."""
    try:
        data = (ROOT / path).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def test_no_work_history_or_outside_paths_in_tracked_files():
    report = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for number, rule, match in violations(text):
            report.append(f"{path}:{number}: {rule}: {match!r}")
    assert not report, "\n".join(
        [f"{len(report)} mention(s) of work history or of paths outside the repository:"] + report)


# The rules themselves, on sentences built here (split so that this file holds no match of its own).
_S, _I, _P = "sess" + "ion", "iss" + "ue", "pa" + "ss"
FLAGGED = (
    f"measured in {_S} 17",
    f"{_S}s 11 to 15 ran on Zen 3",
    f"within {_I} 16's 1.2x",
    f"({_I}s 16, 17)",
    f"{_I} #17",
    f"the twel" + f"fth {_P}",
    f"since the seve" + f"nth {_P}'s encodes",
    f"the eighth to eleve" + f"nth {_P}es",
    f"docs/benchmarks.md, 13" + f"th {_P}",
    f"{_P} 3 of the benchmark",
    "see ALGORI" + "THMS.md section 8",
    "the spec's AB" + "I.md",
    "ANCH" + "ORS.md",
    "../sha" + "red/sp" + "ec/AB" + "I.md",
    "`sp" + "ec/ALGORI" + "THMS.md`",
    "gcc -o /t" + "mp/x x.c",
    "comp-dir-path='/wo" + "rk/main/build-test'",
    "/ro" + "ot/.cache/pip",
)
ALLOWED = (
    f"the binding {_P}es the learning rate as a host double",
    f"a {_P} over the block's grads",
    f"the update in two {_P}es",
    f"the first {_P} of the loop writes, the second {_P} encodes",
    f"in a second {_P} over each block",
    f"585 {_P}ed, 0 failed, 38 skipped",
    f"an {_I} tracker",
    f"{_I} tracking systems",
    f"in one {_P} 1.186 ns/elem",
    f"three {_P}es",
    "docs/abi.md and docs/formats.md",
    f"in one {_P} 12.5 ns/elem",
    "inspect.signature(optax.adamw)",
    "the 4-bit paper's zero-point problem",
    "pathlib.Path.home() / '.cache'",
    "src/validate.cpp, kernels/cpu/step_simd.cpp",
)


@pytest.mark.parametrize("sentence", FLAGGED)
def test_rules_flag_history_and_outside_paths(sentence):
    assert violations(sentence), sentence


@pytest.mark.parametrize("sentence", ALLOWED)
def test_rules_leave_ordinary_english_alone(sentence):
    assert not violations(sentence), violations(sentence)
