"""The package layering, checked from the source: gateway and backend never import each other (what they share
lives in tokenedge_wire), and no module imports itself back through others, lazily or not. And the size rule
of shared/STYLE.md, enforced: every Python file under 400 lines, every function at most 60."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("gateway", "backend", "cdn", "tokenedge_wire")
SOURCE_ROOTS = (*PACKAGES, "bench", "harness", "tests", "scripts")
MAX_FILE_LINES = 400  # a file has fewer
MAX_FUNCTION_LINES = 60  # a function (or method, nested or not) has at most this many, `def` to last line
# Over the limit here, split on branch issue-18b: delete each entry when that lands (a stale entry fails).
PENDING: set[str] = set()  # functions allowed over the limit while someone splits them (none now)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every project module `name` imports, at module level or inside a function (a lazy import is still an edge)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: set(_imports(name, path, known)) for name, path in known.items()}


def test_gateway_and_backend_never_import_each_other() -> None:
    crossings = sorted(
        (a, b)
        for a, targets in _graph().items()
        for b in targets
        if {a.split(".")[0], b.split(".")[0]} == {"gateway", "backend"}
        or (a.startswith("tokenedge_wire") and not b.startswith("tokenedge_wire"))
    )
    assert not crossings, crossings


def test_lazy_and_type_only_imports_are_edges(tmp_path: Path) -> None:
    """The cycle check sees an import inside a function or under TYPE_CHECKING: a cycle hidden that way counts."""
    module = tmp_path / "lazy.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gateway.state import GatewayState\n"
        "def f() -> None:\n    from gateway.misses.streaming import broadcast\n    import gateway.misses.fill\n"
    )
    found = set(_imports("gateway.lazy", module, _modules()))
    assert {"gateway.state", "gateway.misses.streaming.broadcast", "gateway.misses.fill"} <= found


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    # a package's __init__ re-exporting its children is not a cycle of behaviour: drop parent -> child edges
    edges = {a: {b for b in targets if not b.startswith(a + ".")} for a, targets in graph.items()}
    cycles = _cycles(edges)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _gateway_table() -> list[str]:
    """The first cell of each row of docs/layout.md's gateway table: the rooms, lowest first."""
    section = (ROOT / "docs" / "layout.md").read_text().split("## gateway/", 1)[1].split("\n## ", 1)[0]
    return [
        m.group(1) for line in section.splitlines() if (m := re.match(r"\| `([a-z_]+)(?:/|\.py)` \|", line))
    ]


# The gateway's layers, lowest first, written once: docs/layout.md's table. A module may import its own room and the
# rooms below it, never one above. A room is a first-level entry of gateway/ (a folder or a module). The shell
# (handlers, app, __main__) is the top; `gateway.state` is the shell's, and the layers below take the part they read.
LAYERS: tuple[str, ...] = tuple(_gateway_table())
SHELL = ("gateway.app", "gateway.handlers", "gateway.__main__")
MAX_ROOMS = 15  # 15: intake, the one pipeline from a request to its decision and key (issue 34)
MAX_STATE_IMPORTERS = 6


def _room(module: str) -> str | None:
    """`gateway.misses.stream` -> `misses`; None for `gateway` itself and for other packages."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gateway" and len(parts) > 1 else None


def test_the_gateway_has_at_most_15_rooms_and_every_one_is_in_the_layer_order() -> None:
    assert len(LAYERS) > 10 and LAYERS[0] == "web" and LAYERS[-1] == "__main__", LAYERS
    assert LAYERS.index("hits") < LAYERS.index("intake") < LAYERS.index("edge"), LAYERS
    rooms = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "gateway").iterdir() if _is_room(p)}
    assert len(rooms) <= MAX_ROOMS, sorted(rooms)
    assert rooms == set(LAYERS), (
        f"rooms not in LAYERS: {sorted(rooms - set(LAYERS))}; gone: {sorted(set(LAYERS) - rooms)}"
    )


def _is_room(path: Path) -> bool:
    if path.name.startswith(("_", ".")) and path.name != "__main__.py":
        return False
    return (path.suffix == ".py") or (path.is_dir() and (path / "__init__.py").exists())


def _upward(graph: dict[str, set[str]]) -> list[str]:
    rank = {room: i for i, room in enumerate(LAYERS)}
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if (ra := _room(a)) and (rb := _room(b)) and ra != rb and rank[rb] > rank[ra]
    )


def test_no_gateway_import_runs_up_the_layers() -> None:
    upward = _upward(_graph())
    assert not upward, "\n".join(upward)


def test_the_layer_check_sees_an_import_that_runs_up() -> None:
    graph = {"gateway.keys.policy": {"gateway.hits.verdict"}, "gateway.hits.verdict": {"gateway.keys.policy"}}
    assert _upward(graph) == ["gateway.keys.policy -> gateway.hits.verdict"]


def _folder_cycles(graph: dict[str, set[str]], folder: str) -> list[list[str]]:
    """Cycles among the direct children (modules and sub-folders) of `folder`, following their modules' imports."""
    prefix = folder + "."

    def child(module: str) -> str | None:
        return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

    edges: dict[str, set[str]] = {}
    for a, targets in graph.items():
        if (ca := child(a)) is not None:
            edges.setdefault(ca, set()).update(cb for b in targets if (cb := child(b)) and cb != ca)
    return _cycles(edges)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def test_no_folder_of_the_gateway_has_an_import_cycle_among_its_children() -> None:
    graph = _graph()
    folders = {"gateway"} | {
        m for m in graph if m.startswith("gateway.") and (ROOT / m.replace(".", "/")).is_dir()
    }
    cycles = {f: c for f in sorted(folders) if (c := _folder_cycles(graph, f))}
    assert not cycles, cycles


def test_the_folder_check_sees_a_cycle_through_a_subfolder() -> None:
    graph = {
        "gateway.misses.streaming.tee": {"gateway.misses.answer"},
        "gateway.misses.answer": {"gateway.misses.streaming.sse"},
    }
    assert _folder_cycles(graph, "gateway.misses") == [["answer", "streaming", "answer"]]


def test_only_the_shell_imports_gateway_state() -> None:
    importers = sorted(a for a, targets in _graph().items() if "gateway.state" in targets)
    outside = [a for a in importers if not a.startswith(SHELL)]
    assert not outside, f"below the shell, take the part of the state you read (docs/layout.md): {outside}"
    assert len(importers) <= MAX_STATE_IMPORTERS, importers


def _layout_rows(doc: str = "README.md") -> dict[str, str]:
    readme = (ROOT / doc).read_text()
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0] if "## Layout" in readme else readme
    rows = [line.split(" | ", 1) for line in table.splitlines() if line.startswith("| `")]
    return {cell.strip("| "): what for cell, what in rows}


def test_the_readme_layout_names_every_top_level_folder() -> None:
    named = " ".join(_layout_rows())
    folders = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and p.name != "build"
        and not p.name.endswith(".egg-info")
    }
    missing = sorted(f for f in folders if f"`{f}/`" not in named)
    assert not missing, f"README layout lacks {missing}"


def test_every_gateway_module_the_layout_map_names_exists_and_every_module_is_named() -> None:
    section = (ROOT / "docs" / "layout.md").read_text().split("## gateway/", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z_/]+(?:\.py|/))`", section))
    assert len(named) > 20
    missing = sorted(n for n in named if not (ROOT / "gateway" / n).exists())
    assert not missing, missing
    folders = tuple(n for n in named if n.endswith("/"))
    unnamed = sorted(
        rel
        for path in (ROOT / "gateway").rglob("*.py")
        if path.name != "__init__.py"
        and (rel := path.relative_to(ROOT / "gateway").as_posix()) not in named
        and not rel.startswith(tuple(f for f in folders if f.count("/") > 1))
    )
    assert not unnamed, f"docs/layout.md does not name {unnamed}"


def _sources() -> dict[str, str]:
    """Every Python file of the project by path from the root, virtual environments and hidden folders aside."""
    out: dict[str, str] = {}
    for root in SOURCE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if not any(part.startswith(".") or part in ("node_modules", "build") for part in relative.parts):
                out[relative.as_posix()] = path.read_text(encoding="utf-8")
    return out


# Who may not import whom, by path prefix: the tests and the benchmarks share harness/, never each other, and a
# scenario takes what it shares with another from bench/measure/ (issue 36).
FORBIDDEN = {
    "tests/": ("bench",),
    "bench/": ("tests",),
    "harness/": ("bench", "tests"),
    "bench/scenarios/": ("bench.scenarios",),
}


def _imported(path: str, text: str) -> Iterator[tuple[int, list[str]]]:
    """(line, the modules it names) for every import in `path`, lazy or not; a relative one resolved against its
    package, and `from a import b` naming both `a` and `a.b` (b may be a module)."""
    package = Path(path).parent.parts
    for node in ast.walk(ast.parse(text, filename=path)):
        if isinstance(node, ast.Import):
            yield node.lineno, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield node.lineno, [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _forbidden_imports(sources: dict[str, str]) -> list[str]:
    """`path:line imports module` for every import a path's prefix in FORBIDDEN rules out."""
    found = []
    for path, text in sources.items():
        banned = [b for prefix, names in FORBIDDEN.items() if path.startswith(prefix) for b in names]
        for line, targets in _imported(path, text):
            hits = [t for t in targets for b in banned if t == b or t.startswith(b + ".")]
            if hits:
                found.append(f"{path}:{line} imports {min(hits, key=len)}")
    return sorted(found)


def test_tests_and_bench_never_import_each_other_and_scenarios_stand_alone() -> None:
    sources = _sources()
    assert {"harness/services.py", "bench/scenarios/gateway.py", "bench/measure/load.py"} <= set(sources)
    crossings = _forbidden_imports(sources)
    assert not crossings, "share it through harness/ (or bench/measure/):\n" + "\n".join(crossings)


def test_the_import_rule_sees_a_planted_crossing() -> None:
    planted = {
        "tests/gateway/test_x.py": "from bench.measure.load import wrk\n",
        "tests/backend/test_y.py": "from bench import scenarios\n",
        "bench/scenarios/a.py": "def f() -> None:\n    import tests.support.rawhttp\n",
        "bench/scenarios/b.py": "from .leases import pct\nfrom bench.measure.load import pct as p\n",
        "harness/c.py": "from bench.measure import hits\nimport harness.services\n",
        "tests/ok.py": "from harness.services import RedisServer\nimport benchmark_tools\n",
        "bench/measure/ok.py": "from bench.scenarios import leases\nfrom harness.gateway import FakeClock\n",
    }
    assert _forbidden_imports(planted) == [
        "bench/scenarios/a.py:2 imports tests.support.rawhttp",
        "bench/scenarios/b.py:1 imports bench.scenarios.leases",
        "harness/c.py:1 imports bench.measure",
        "tests/backend/test_y.py:1 imports bench",
        "tests/gateway/test_x.py:1 imports bench.measure.load",
    ]


def _function_sizes() -> dict[str, int]:
    """`path::name` -> lines from `def` to the function's last line, for every function and method."""
    sizes: dict[str, int] = {}
    for name, text in _sources().items():
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                where = f"{name}::{node.name}"
                sizes[where] = max(sizes.get(where, 0), node.end_lineno - node.lineno + 1)
    return sizes


def test_every_python_file_is_under_400_lines() -> None:
    sources = _sources()
    assert len(sources) > 200 and "gateway/app.py" in sources and "tests/test_architecture.py" in sources
    too_long = sorted(
        f"{name}: {n} lines"
        for name, text in sources.items()
        if (n := len(text.splitlines())) >= MAX_FILE_LINES
    )
    assert not too_long, "split by theme (shared/STYLE.md):\n" + "\n".join(too_long)


def test_every_function_is_at_most_60_lines() -> None:
    sizes = _function_sizes()
    too_long = sorted(
        f"{where}: {n} lines" for where, n in sizes.items() if n > MAX_FUNCTION_LINES and where not in PENDING
    )
    assert not too_long, "split into named steps (shared/STYLE.md):\n" + "\n".join(too_long)
    stale = sorted(where for where in PENDING if sizes.get(where, 0) <= MAX_FUNCTION_LINES)
    assert not stale, f"now within the limit or gone: remove from PENDING: {stale}"


# The steps from a request to its decision and key, each named where it is defined; written once, in the intake room.
KEY_PIPELINE = {
    "decide": "gateway/keys/policy.py",
    "confirm_seeded": "gateway/keys/policy.py",
    "derive_key_from_bytes": "gateway/keys/derive.py",
    "key_form": "gateway/tokens/keyform.py",
    "key_tokenizer": "gateway/tokens/keyform.py",
}


def test_the_key_pipeline_is_written_once() -> None:
    """Only gateway/intake/pipeline.py calls the steps from a request to its decision and key: the routes, explain
    and the fast lane take them from there, so no lane can key or decide a request another way (issue 34)."""
    callers: dict[str, set[str]] = {name: set() for name in KEY_PIPELINE}
    for path in (ROOT / "gateway").rglob("*.py"):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = (
                    func.id
                    if isinstance(func, ast.Name)
                    else func.attr
                    if isinstance(func, ast.Attribute)
                    else ""
                )
                if name in callers and where != KEY_PIPELINE[name]:
                    callers[name].add(where)
    routing_policy = "gateway/upstream/routing/"  # its own `decide`: which engine, not whether to cache
    strays = {n: sorted(w for w in c if not w.startswith(routing_policy)) for n, c in callers.items()}
    assert all(c == ["gateway/intake/pipeline.py"] for c in strays.values()), strays
