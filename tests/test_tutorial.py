"""Every code block of the tutorial runs here, so the tutorial cannot rot.

Pages: ``docs/tutorial.md``, ``docs/tutorial/*.md``, ``docs/repro.md`` and ``docs/distributed.md``. Their fenced blocks are
handled in order; markers are HTML comments on the lines just above a fence
(invisible when the page is rendered):

* ```` ```python ````: exec'd in one namespace shared by the page; what it
  prints is the block's output.
* ```` ```python title="test_x.py" ```` (or any block under
  ``<!-- file: test_x.py -->``): written into the page's pytester directory.
  A pytest command of the page must name the file.
* ```` ```bash ````: every line is ``pytest ...`` (or ``python -m pytest ...``),
  run in process in that directory; the runs' stdout is the block's output.
* ``<!-- output -->`` + ```` ```text ````: must match the output of the last
  block that ran (see :func:`match_output`). ``<!-- output (no GPU) -->``:
  the same, only where CUDA is absent (a GPU run prints CUDA results instead).
* ``<!-- from: PATH -->`` + any block: must appear verbatim in PATH (relative
  to the repository). Lines ``// ...`` or ``# ...`` mark a cut: the pieces
  between them must appear in PATH in that order. Every ``cpp``/``cuda``
  block needs one, so the kernel code shown is the kernel code built.
* ``<!-- not run: REASON -->``: shown only (e.g. needs a GPU); a reason is required.
* ``<!-- requires: extension -->`` anywhere on a page: the page is skipped
  where the C++ extension cannot be built (no compiler or ninja).
* ``<!-- requires: dtensor -->``: the page is skipped where torch has no public
  ``torch.distributed.tensor`` (before 2.5).
* ``<!-- requires: triton -->``: the page is skipped without triton or
  without its interpreter (``TRITON_INTERPRET=1``, set by ``conftest.py``
  where there is no GPU).

Any other block fails the test: nothing is shown that is not checked.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import reference_ops.buggy  # noqa: F401  (imported before in-process runs; see conftest.py)
from reference_ops import extension

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "tutorial.md", *sorted((ROOT / "docs" / "tutorial").glob("*.md"))]
# Pages outside the tutorial whose examples run the same way.
EXECUTED_PAGES = [ROOT / "docs" / "repro.md", ROOT / "docs" / "distributed.md"]

FENCE = re.compile(r"^(?P<fence>```+)(?P<lang>[\w+-]*)(?P<info>.*)$")
MARKER = re.compile(r"^<!--\s*(?P<text>.*?)\s*-->$")
TITLE = re.compile(r'title="(?P<name>[^"]+)"')
SOURCE_LANGS = {"cpp", "c++", "cuda", "c", "h"}
# Added to every tutorial command. An in-process run forgets the modules first
# imported during it, and hypothesis's plugin imports hypothesis (seconds) in
# each run's terminal summary; neither plugin is part of the tutorial.
QUIET_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the first body line
    lang: str
    info: str
    body: str
    markers: list = field(default_factory=list)

    @property
    def where(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def marker(self, name):
        """Text after ``name`` of the first marker starting with it, or None."""
        for text in self.markers:
            if text == name or text.startswith((name + ":", name + " ")):
                return text[len(name):].lstrip(" :")
        return None


def parse_blocks(page):
    """Fenced blocks of a page, each with the markers directly above it."""
    lines = page.read_text().splitlines()
    blocks, pending, i = [], [], 0
    while i < len(lines):
        line = lines[i].strip()
        marker = MARKER.match(line)
        fence = FENCE.match(line)
        if marker:
            pending.append(marker.group("text"))
        elif fence:
            close = fence.group("fence")
            body = []
            i += 1
            start = i + 1
            while i < len(lines) and lines[i].strip() != close:
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise AssertionError(f"{page.relative_to(ROOT)}:{start - 1}: unclosed code fence")
            blocks.append(Block(page, start, fence.group("lang"), fence.group("info"), "\n".join(body) + "\n", pending))
            pending = []
        elif line:
            pending = []
        i += 1
    return blocks


def page_markers(page):
    return [m.group("text") for m in map(MARKER.match, (line.strip() for line in page.read_text().splitlines())) if m]


# ---------------------------------------------------------------------------
# Matching shown output against a real run
# ---------------------------------------------------------------------------

_TOKEN = re.compile(
    r"(?P<gap>\.\.\.)"
    r"|(?P<seed>(?<=seed: )\d+)"
    r"|(?P<time>(?<![\w.])\d+(?:\.\d+)?s\b)"
    r"|(?P<rule>(?P<rulechar>[=_-])(?P=rulechar){2,})"
    r"|(?P<number>(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.]))"
    r"|(?P<space>\s+)"
    r"|(?P<char>.)"
)


_LONG_RUN = re.compile(r"(\d+(?:\.\d+)?s) \(\d+:\d\d:\d\d\)")


def line_pattern(shown):
    """(compiled regex, expected numbers) for one shown line."""
    parts, numbers = [], []
    for token in _TOKEN.finditer(shown):
        kind, text = token.lastgroup, token.group()
        if kind == "gap" or kind == "seed":
            parts.append(".*?")
        elif kind == "time":
            parts.append(r"\d+(?:\.\d+)?s")
        elif kind == "rule":
            parts.append(re.escape(text[0]) + "{3,}")
        elif kind == "number":
            parts.append(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)")
            numbers.append(float(text))
        elif kind == "space":
            parts.append(r"\s+")
        else:
            parts.append(re.escape(text))
    return re.compile("".join(parts)), numbers




def line_matches(shown, real):
    """Same text; numbers equal to 0.1% (seeds, timings and ``...`` match anything)."""
    pattern, numbers = line_pattern(shown.rstrip())
    real = _LONG_RUN.sub(r"\1", real)  # pytest adds "(0:01:24)" to a run over a minute
    found = pattern.fullmatch(real.rstrip())
    if found is None:
        return False
    return all(math.isclose(float(got), want, rel_tol=1e-3, abs_tol=1e-12)
               for got, want in zip(found.groups(), numbers))


def match_output(shown_text, real_lines):
    """None if the shown output is a faithful excerpt of the real one, else why not.

    Shown lines match real lines one to one (see :func:`line_matches`). A line
    that is just ``...`` stands for any number of real lines; without one at
    the start (end), the excerpt must start (end) where the real output does.
    """
    shown = shown_text.rstrip("\n").split("\n")
    real = [line.rstrip() for line in real_lines]
    while real and not real[-1]:
        real.pop()
    segments, current = [], []
    open_start = bool(shown) and shown[0].strip() == "..."
    open_end = bool(shown) and shown[-1].strip() == "..."
    for line in shown:
        if line.strip() == "...":
            if current:
                segments.append(current)
            current = []
        else:
            current.append(line)
    if current:
        segments.append(current)
    position = 0
    for n, segment in enumerate(segments):
        first, last = n == 0, n == len(segments) - 1
        if first and not open_start:
            candidates = [0]
        elif last and not open_end:
            candidates = [len(real) - len(segment)]
        else:
            candidates = range(position, len(real) - len(segment) + 1)
        for start in candidates:
            if start < position or start + len(segment) > len(real):
                continue
            if all(line_matches(s, r) for s, r in zip(segment, real[start:start + len(segment)])):
                position = start + len(segment)
                break
        else:
            return "these shown lines do not appear (in order) in the real output:\n" + "\n".join(segment)
    if segments and not open_end and position != len(real):
        return "the real output goes on after the shown lines (end the excerpt with a line `...`)"
    return None


# ---------------------------------------------------------------------------
# Running a page
# ---------------------------------------------------------------------------


def check_included(block, path_text):
    """The block is a verbatim excerpt of the named repository file."""
    path = ROOT / path_text.strip()
    assert path.is_file(), f"{block.where}: `from: {path_text}` names no file of the repository"
    text = path.read_text()
    cut = re.compile(r"^\s*(//|#) \.\.\.\s*$")
    pieces, piece = [], []
    for line in block.body.rstrip("\n").split("\n"):
        if cut.match(line):
            pieces.append(piece)
            piece = []
        else:
            piece.append(line)
    pieces.append(piece)
    position = 0
    for piece in pieces:
        if not piece:
            continue
        excerpt = "\n".join(piece) + "\n"
        found = text.find(excerpt, position)
        assert found >= 0, (
            f"{block.where}: this excerpt is not (or no longer) in {path_text}; copy it again from the file:\n{excerpt}"
        )
        position = found + len(excerpt)


def pytest_arguments(block, command):
    words = shlex.split(command)
    if words[:1] == ["pytest"]:
        return words[1:]
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1:3] == ["-m", "pytest"]:
        return words[3:]
    raise AssertionError(f"{block.where}: only pytest commands can run here, not {command!r}; "
                         "mark a block that is shown only with <!-- not run: REASON -->")


class PageRun:
    """State while running one page: its namespace, its directory, the last output."""

    def __init__(self, page, pytester):
        self.page = page
        self.pytester = pytester
        self.namespace = {"__name__": "tutorial_" + re.sub(r"\W", "_", page.stem)}
        self.output = None  # lines of the last block that ran
        self.files = []
        self.commands = []

    def run(self, block):
        include = block.marker("from")
        if block.marker("not run") is not None:
            assert block.marker("not run"), f"{block.where}: say why the block is not run: <!-- not run: REASON -->"
            return
        if include is not None:
            check_included(block, include)
            return
        assert block.lang not in SOURCE_LANGS, (
            f"{block.where}: C++/CUDA shown in the tutorial must come from the real sources: "
            "add <!-- from: csrc/FILE --> above it"
        )
        title = TITLE.search(block.info)
        name = block.marker("file") or (title.group("name") if title else None)
        if name:
            self.pytester.path.joinpath(name).write_text(block.body)
            self.files.append((name, block))
            return
        output = block.marker("output")
        if output is not None:
            self.check_output(block, output)
            return
        if block.lang == "python":
            self.exec_python(block)
            return
        if block.lang in ("bash", "sh", "console", "shell"):
            self.run_commands(block)
            return
        raise AssertionError(f"{block.where}: a ```{block.lang} block with no marker is neither run nor checked; "
                             "see tests/test_tutorial.py for the markers")

    def exec_python(self, block):
        code = compile("\n" * (block.line - 1) + block.body, str(block.page), "exec")
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(code, self.namespace)  # noqa: S102 - running the tutorial's code is the point
        self.output = buffer.getvalue().splitlines()

    def run_commands(self, block):
        lines = []
        for command in block.body.splitlines():
            command = command.strip()
            if not command or command.startswith("#"):
                continue
            arguments = pytest_arguments(block, command)
            self.commands.append(arguments)
            result = self.pytester.runpytest_inprocess(*arguments, *QUIET_PLUGINS)
            lines += result.outlines
        self.output = lines

    def check_output(self, block, condition):
        if condition and "no GPU" in condition and torch.cuda.is_available():
            return
        assert self.output is not None, f"{block.where}: an output block needs a block that ran before it"
        problem = match_output(block.body, self.output)
        if problem:
            real = "\n".join(self.output)
            pytest.fail(f"{block.where}: shown output does not match the real run: {problem}\n\n"
                        f"--- real output ---\n{real}", pytrace=False)

    def finish(self):
        named = {word for arguments in self.commands for word in arguments}
        for name, block in self.files:
            if name.startswith("test_") and not any(word.split("::")[0] == name for word in named):
                pytest.fail(f"{block.where}: no pytest command of the page runs {name}", pytrace=False)


@pytest.mark.parametrize("page", PAGES + EXECUTED_PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_every_block_of_the_page_runs_and_shows_its_real_output(page, pytester):
    # The first build of the extension takes a while; torch caches it, and the result is remembered.
    if "requires: extension" in page_markers(page) and not extension.extension_available():
        pytest.skip("the C++ extension cannot be built here (see reference_ops/extension.py for what to install)")
    if "requires: dtensor" in page_markers(page) and importlib.util.find_spec("torch.distributed.tensor") is None:
        pytest.skip("DTensor's placements are public from torch 2.5 (torch.distributed.tensor)")
    if "requires: triton" in page_markers(page):
        triton_problem = _triton_interpreter_problem()
        if triton_problem:
            pytest.skip(triton_problem)
    run = PageRun(page, pytester)
    torch.manual_seed(0)
    for block in parse_blocks(page):
        run.run(block)
    run.finish()


def _triton_interpreter_problem():
    """Why a Triton page cannot run here (its runs are on CPU, in Triton's interpreter), or None."""
    import importlib.util

    from pytest_autograd.engine.triton_interpreter import interpreter_on

    if importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install -e '.[triton]' installs it"
    if not interpreter_on():
        return "the page runs Triton kernels on CPU tensors, which needs TRITON_INTERPRET=1 before triton is imported"
    return None


def test_the_tutorial_has_pages_and_every_page_is_linked_from_the_first():
    assert PAGES and PAGES[0].name == "tutorial.md", "docs/tutorial.md is the tutorial's first page"
    first = PAGES[0].read_text()
    for page in PAGES[1:]:
        assert f"tutorial/{page.name}" in first, f"docs/tutorial.md does not link to {page.name}"


# ---------------------------------------------------------------------------
# The matcher itself: it must catch a stale excerpt
# ---------------------------------------------------------------------------

REAL = [
    "header that varies",
    "gradient of output w.r.t. `weight` does not match the numerical derivative",
    "  worst element: d output[1, 0] / d weight[1, 2]: expected 0 (numerical), got 2.36568 (analytical)",
    "  seed: 1434113988",
    "======= 1 failed in 0.53s =======",
]


def test_output_excerpts_match_numbers_seeds_timings_and_rules_loosely():
    shown = "\n".join([
        "...",
        "gradient of output w.r.t. `weight` does not match the numerical derivative",
        "  worst element: d output[1, 0] / d weight[1, 2]: expected 0 (numerical), got 2.36569 (analytical)",
        "  seed: 7",
        "=== 1 failed in 9.99s ===",
    ])
    assert match_output(shown, REAL) is None


def test_a_shown_run_time_matches_a_run_over_a_minute():
    shown = "=== 12 passed, 24 skipped in 9.99s ==="
    assert match_output(shown, ["===== 12 passed, 24 skipped in 84.19s (0:01:24) ====="]) is None
    assert match_output("=== ... passed in ...s ===", ["===== 12 passed in 84.19s (0:01:24) ====="]) is None
    assert match_output(shown, ["===== 12 passed, 24 skipped in 84.19s (0:01:24) extra ====="]) is not None


def test_a_run_of_over_a_minute_matches_a_shown_timing():
    real = ["======================== 5 passed, 8 skipped in 61.23s (0:01:01) ========================"]
    assert match_output("=== ... passed, ... skipped in ...s ===", real) is None
    assert match_output("=== 5 passed, 8 skipped in 0.5s ===", real) is None
    assert match_output("=== 5 passed, 9 skipped in 0.5s ===", real) is not None


@pytest.mark.parametrize("line, real_text, stale_text", [
    (2, "got 2.36568", "got 2.5"),  # a number that changed
    (2, "d weight[1, 2]", "d weight[2, 1]"),  # an index that changed
    (1, "w.r.t. `weight`", "w.r.t. `input`"),  # a word that changed
])
def test_output_excerpts_with_a_changed_value_do_not_match(line, real_text, stale_text):
    shown = "\n".join(["...", REAL[line].replace(real_text, stale_text), "..."])
    assert match_output(shown, REAL) is not None


def test_output_excerpts_must_follow_the_real_order_and_ends():
    assert match_output("\n".join(["...", REAL[2], REAL[1], "..."]), REAL) is not None
    assert match_output("\n".join([REAL[1], "..."]), REAL) is not None  # the real output starts elsewhere
    assert match_output("\n".join(["...", REAL[1]]), REAL) is not None  # and goes on
    assert match_output("\n".join(["...", REAL[1], "...", REAL[4]]), REAL) is None


# ---------------------------------------------------------------------------
# The page runner itself: what it refuses
# ---------------------------------------------------------------------------


def run_page(tmp_path, pytester, text):
    page = ROOT / "docs" / "tutorial" / "_probe.md"  # never written: only its name is used
    page_file = tmp_path / "probe.md"
    page_file.write_text(text)
    run = PageRun(page, pytester)
    for block in parse_blocks(page_file):
        block.page = page
        run.run(block)
    run.finish()


def test_an_excerpt_that_differs_from_the_sources_is_refused(tmp_path, pytester):
    text = '<!-- from: csrc/register.cpp -->\n```cpp\nTORCH_LIBRARY(autograd_ext, m) {\n  m.def("nothing");\n```\n'
    with pytest.raises(AssertionError, match="not \\(or no longer\\) in csrc/register.cpp"):
        run_page(tmp_path, pytester, text)


def test_kernel_code_not_taken_from_the_sources_is_refused(tmp_path, pytester):
    with pytest.raises(AssertionError, match="must come from the real sources"):
        run_page(tmp_path, pytester, "```cpp\nint main() {}\n```\n")


def test_a_block_that_is_neither_run_nor_checked_is_refused(tmp_path, pytester):
    with pytest.raises(AssertionError, match="neither run nor checked"):
        run_page(tmp_path, pytester, "```text\nsome output nobody checks\n```\n")


def test_a_test_file_that_no_command_runs_is_refused(tmp_path, pytester):
    with pytest.raises(pytest.fail.Exception, match="no pytest command of the page runs test_x.py"):
        run_page(tmp_path, pytester, '```python title="test_x.py"\ndef test_x():\n    pass\n```\n')


def test_python_output_is_compared_with_what_the_block_printed(tmp_path, pytester):
    run_page(tmp_path, pytester, "```python\nprint(6 * 7)\n```\n\n<!-- output -->\n```text\n42\n```\n")
    with pytest.raises(pytest.fail.Exception, match="shown output does not match"):
        run_page(tmp_path, pytester, "```python\nprint(6 * 7)\n```\n\n<!-- output -->\n```text\n41\n```\n")
