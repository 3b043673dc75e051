"""Every example of the README, and the package docstring's quick tour, runs as documented.

* The ``shootdown ...`` commands of README.md's ```sh blocks and of its inline code spans run
  through ``sys.executable -m shootdown`` in a temporary directory that holds the clone's
  ``experiments/``, ``profiles/`` and ``scenarios/`` (symlinks), so a relative path resolves as
  it does in a clone and what a command writes (``--out madv.json``, the sweep cache) stays
  there. Each runs as written, or with ``--quick`` where ``RUN`` says so, and must exit with
  the status the docs give it (``check ... --mutant`` exits 1 on its violation) and print or
  write what they say.
* ``SKIPPED`` lists, each with its reason, the few commands not run. A README command that is
  in neither table fails ``test_every_readme_command_is_run_or_skipped``, so a new example
  cannot be forgotten; an entry no README command matches any more fails it too.
* The ```python blocks run from the repository root with ``quick=True`` added to every
  ``shootdown.*`` call that takes it (except ``NOT_QUICK``'s), and the quick tour of
  ``shootdown.__doc__`` as it is, from a temporary directory.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pytest
from conftest import requires_native

import shootdown

pytestmark = requires_native

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DATA_DIRS = ("experiments", "profiles", "scenarios")
TIMEOUT_S = 120  # per command; the slowest run here takes about 10 s on 2 idle cores

#: README placeholders, and what a command runs with in their place.
PLACEHOLDERS = {"FILE": "experiments/seeds/seed000-sysbench-mitigations.toml"}


@dataclass(frozen=True)
class Run:
    """How one README command runs: ``add`` appended to it, the exit ``status`` the docs give,
    ``expect(stdout, workdir)`` asserting what it printed or wrote, and the module of an extra
    it ``needs`` (the test is skipped without it)."""

    add: Tuple[str, ...] = ()
    status: int = 0
    expect: Optional[Callable[[str, Path], None]] = field(default=None, compare=False)
    needs: Optional[str] = None


def _prints(*patterns: str) -> Callable[[str, Path], None]:
    def expect(out: str, _: Path) -> None:
        for pattern in patterns:
            assert re.search(pattern, out), f"output lacks {pattern!r}:\n{out[-2000:]}"

    return expect


def _json_records_of(seed: str) -> Callable[[str, Path], None]:
    def expect(out: str, _: Path) -> None:
        records = json.loads(out)
        assert records and {r["seed"] for r in records} == {seed}
        assert {"row", "variant", "published", "simulated", "stdev"} <= set(records[0])

    return expect


def _csv(out: str, _: Path) -> None:
    header = out.splitlines()[0].split(",")
    assert {"seed", "row", "variant", "simulated"} <= set(header), header


def _wrote(name: str, check: Callable[[Path], bool]) -> Callable[[str, Path], None]:
    def expect(_: str, workdir: Path) -> None:
        path = workdir / name
        assert path.is_file() and check(path), f"{name} missing or malformed"

    return expect


def _trace_file(path: Path) -> bool:
    return bool(json.loads(path.read_text()).get("traceEvents"))


def _svg_file(path: Path) -> bool:
    return "<svg" in path.read_text()[:2000]


def _swept(out: str, workdir: Path) -> None:
    assert any((workdir / ".shootdown-cache").iterdir()), "the sweep cached no point"


#: Every README command that runs (key: the command as written, placeholders kept).
RUN: Dict[str, Run] = {
    # Quickstart: the prose's --quick form of the main job (the full one is skipped below).
    "shootdown reproduce --quick": Run(expect=_prints(r"directions \d+ of \d+")),
    "shootdown plot 002 --out seed002.svg": Run(
        add=("--quick",), expect=_wrote("seed002.svg", _svg_file), needs="matplotlib"
    ),
    # Using it
    "shootdown reproduce 000 --format json": Run(add=("--quick",), expect=_json_records_of("000")),
    "shootdown list": Run(expect=_prints("seed002-madv-dontneed", "pv_tlb_flush")),
    "shootdown run experiments/seeds/seed002-madv-dontneed.toml --set workload.iterations=500": Run(
        expect=_prints("seed 002")
    ),
    "shootdown run seed002-madv-dontneed --quick": Run(expect=_prints("seed 002")),
    "shootdown run will-it-scale-tlb-flush2": Run(
        add=("--quick",), expect=_prints("v6.15 INVLPGB", "iterations/s")
    ),
    "shootdown check early_ack --set options.early_ack=rfc_v2": Run(
        status=1, expect=_prints(r"verdict: violation \(INV-STALE\)")
    ),
    "shootdown run FILE --set variants.after.options.smp_call=remote_then_local --format csv": Run(
        add=("--quick",), expect=_csv
    ),
    "shootdown trace seed002-madv-dontneed --out madv.json": Run(
        add=("--quick",), expect=_wrote("madv.json", _trace_file)
    ),
    # Row 4 is not among seed 000's quick rows; the full row takes ~2 s.
    "shootdown profile experiments/seeds/seed000-sysbench-mitigations.toml --row 4": Run(
        expect=_prints("smp_call_function_many_cond", "flush_tlb_func")
    ),
    "shootdown check --list": Run(expect=_prints(r"lazy_munmap", r"\[N3 · fix b956575bed91\] ")),
    "shootdown check lazy_munmap --mutant lazy_ignores_freed_tables": Run(
        status=1, expect=_prints(r"verdict: violation \(INV-PTFREE\)")
    ),
    "shootdown check flush_catchup --memory-model tso": Run(expect=_prints("verdict: verified")),
    "shootdown check smp_call_concurrent --memory-model tso": Run(
        expect=_prints("verdict: verified")
    ),
    "shootdown check pv_tlb_flush --set cpus=3": Run(
        expect=_prints(r"note: --set cpus=3: cpu2 runs a copy of cpu1's tasks \(reader\)")
    ),
    "shootdown bench experiments/seeds/seed000-sysbench-mitigations.toml"
    " --set experiment.rows=[48]": Run(expect=_prints(r"steps/s: [\d,]+")),
    "shootdown sweep seed000-sysbench-mitigations --quick"
    " --grid profile_override.cost.ipi_latency_same_socket=600,1200"
    " --grid experiment.quick_rows=[8],[24]": Run(expect=_swept),
}

#: README commands not run, each with its reason (shown in the test id).
SKIPPED: Dict[str, str] = {
    "shootdown reproduce": (
        "the quickstart's full run (~1 min on 2 idle cores); `shootdown reproduce --quick`, "
        "the next command, runs the same paths"
    ),
    "shootdown check flush_catchup_3cpu --memory-model tso --max-states 40000000": (
        "14.0 M states, 0.45 GB: ~20 s alone and ~50 s while builds run on 2 cores"
    ),
    "shootdown calibrate": "measures this machine (~10 s); test_calibrate.py runs it",
    "shootdown validate": "real madvise/mprotect/munmap (~20 s); test_calibrate.py runs it",
    "shootdown sweep seed000-sysbench-mitigations --quick --backend ray --address HEAD:6379"
    " --grid profile_override.cost.ipi_latency_same_socket=600,1200": (
        "needs a Ray cluster at HEAD:6379 and its token; test_ray_cluster.py runs it on one"
    ),
}

#: ``shootdown.*`` calls of the README's Python blocks that keep their configuration.
NOT_QUICK = {"profile": "row=4 is not among seed 000's quick rows (the full row takes ~2 s)"}


# --- extraction ---------------------------------------------------------------------------


def _fenced(text: str, lang: str) -> List[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def _split_command_line(line: str) -> List[Tuple[Dict[str, str], List[str]]]:
    """The simple commands of one shell line (comments dropped, split at ``&&``, ``||``,
    ``;`` and ``|``): each as (environment assignments, words)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: List[Tuple[Dict[str, str], List[str]]] = []
    words: List[str] = []
    for token in list(lexer) + [";"]:
        if token and set(token) <= set(";&|"):
            env: Dict[str, str] = {}
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                name, value = words.pop(0).split("=", 1)
                env[name] = value
            if words:
                commands.append((env, words))
            words = []
        else:
            words.append(token)
    return commands


def readme_commands(text: str) -> Dict[str, List[str]]:
    """Every ``shootdown`` command of the README, as written (words joined by one space, quotes
    removed) -> its words, from the ```sh blocks and from inline code spans in the prose."""
    found: Dict[str, List[str]] = {}
    for block in _fenced(text, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            for _env, words in _split_command_line(line):
                if words[0] == "shootdown":
                    found.setdefault(" ".join(words), words)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for span in re.findall(r"`(shootdown [^`]+)`", prose):
        words = shlex.split(span)
        found.setdefault(" ".join(words), words)
    return found


def python_blocks(text: str) -> List[str]:
    return _fenced(text, "python")


def quick_tour(doc: str) -> str:
    """The indented block after ``Quick tour ...::`` in a docstring."""
    match = re.search(r"Quick tour[^\n]*::\n\n((?:    [^\n]*\n|\n)+)", doc)
    assert match, "shootdown.__doc__ has no 'Quick tour ...::' block"
    return "\n".join(line[4:] for line in match.group(1).splitlines())


class _Quicken(ast.NodeTransformer):
    """Adds ``quick=True`` to every ``shootdown.NAME(...)`` call whose function takes it."""

    def __init__(self) -> None:
        self.quickened: List[str] = []
        self.kept: List[str] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "shootdown"
        ):
            return node
        target = getattr(shootdown, func.attr)
        takes_quick = "quick" in inspect.signature(target).parameters
        if not takes_quick or any(k.arg == "quick" for k in node.keywords):
            return node
        if func.attr in NOT_QUICK:
            self.kept.append(func.attr)
            return node
        node.keywords.append(ast.keyword(arg="quick", value=ast.Constant(True)))
        self.quickened.append(func.attr)
        return node


# --- the tests ------------------------------------------------------------------------------

README_TEXT = README.read_text(encoding="utf-8")
COMMANDS = readme_commands(README_TEXT)


def _params() -> List[object]:
    params: List[object] = []
    for command, words in COMMANDS.items():
        if command in SKIPPED:
            reason = SKIPPED[command]
            skip = pytest.mark.skip(reason=reason)
            params.append(
                pytest.param(command, words, marks=skip, id=f"{command} (skipped: {reason})")
            )
        elif command in RUN:
            add = RUN[command].add
            shown = f"{command} (+ {' '.join(add)})" if add else command
            params.append(pytest.param(command, words, id=shown))
        else:  # fails in test_every_readme_command_is_run_or_skipped
            params.append(pytest.param(command, words, id=f"{command} [unlisted]"))
    return params


def test_every_readme_command_is_run_or_skipped() -> None:
    assert len(COMMANDS) >= 10, "the README's commands were not found: has its layout changed?"
    unlisted = [c for c in COMMANDS if c not in RUN and c not in SKIPPED]
    assert not unlisted, (
        "README commands neither run nor skipped: add each to RUN (how it runs, what the docs "
        "say it does) or, if it takes over a minute, to SKIPPED with the reason:\n"
        + "\n".join(unlisted)
    )
    stale = [c for c in [*RUN, *SKIPPED] if c not in COMMANDS]
    assert not stale, "entries no README command matches any more:\n" + "\n".join(stale)
    assert not set(RUN) & set(SKIPPED)


@pytest.fixture
def clone_dir(tmp_path: Path) -> Path:
    """A working directory that looks like the clone's root to the commands."""
    for name in DATA_DIRS:
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    return tmp_path


def _environment() -> Dict[str, str]:
    env = dict(os.environ)
    package_parent = str(Path(shootdown.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env.pop("SHOOTDOWN_HOME", None)
    env["COLUMNS"] = "200"
    return env


def _argv(words: Sequence[str], add: Sequence[str]) -> List[str]:
    args = [PLACEHOLDERS.get(w, w) for w in words[1:]]
    return [sys.executable, "-m", "shootdown", *args, *add]


@pytest.mark.parametrize(("command", "words"), _params())
def test_readme_command(command: str, words: List[str], clone_dir: Path) -> None:
    if command not in RUN:
        pytest.fail(f"{command!r} is in neither RUN nor SKIPPED")
    how = RUN[command]
    if how.needs:
        pytest.importorskip(how.needs)
    argv = _argv(words, how.add)
    done = subprocess.run(
        argv,
        cwd=clone_dir,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    shown = " ".join(shlex.quote(a) for a in argv[1:])
    assert done.returncode == how.status, (
        f"{shown}: exit {done.returncode}, documented {how.status}\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )
    if how.expect is not None:
        how.expect(done.stdout, clone_dir)


@pytest.mark.parametrize("index", range(len(python_blocks(README_TEXT))))
def test_readme_python_block(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    source = python_blocks(README_TEXT)[index]
    tree = _Quicken().visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    monkeypatch.chdir(REPO)  # the README's paths are relative to the repository root
    namespace: Dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(tree, "README.md (python block)", "exec"), namespace)


def test_readme_python_calls_are_quick_or_listed() -> None:
    """The Python blocks exist, calls that take ``quick`` get it, and every NOT_QUICK entry
    still names a call of theirs (so the exceptions stay few and current)."""
    blocks = python_blocks(README_TEXT)
    assert blocks, "the README has no ```python block"
    quicken = _Quicken()
    for source in blocks:
        quicken.visit(ast.parse(source))
    assert quicken.quickened, "no shootdown.* call of the README's Python takes quick=True"
    assert set(NOT_QUICK) <= set(quicken.kept), "NOT_QUICK names calls the README lacks"


def test_module_docstring_quick_tour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = quick_tour(shootdown.__doc__ or "")
    monkeypatch.chdir(tmp_path)  # the tour names shipped experiments and scenarios: any directory
    out = io.StringIO()
    namespace: Dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        exec(compile(source, "shootdown.__doc__ (quick tour)", "exec"), namespace)
    assert "predicted changes: directions " in out.getvalue()
    assert out.getvalue().splitlines()[-1] == "violation INV-PTFREE"
