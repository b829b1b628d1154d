"""The shape of the package: no import cycles, short functions, a lazy public API, a fast --help.

The import checks follow pip-tools' tests/test_circular_imports.py: every module is imported on
its own in a fresh interpreter (an import cycle that works in one order fails in another), and
the graph of every import statement (module level and inside functions) must be acyclic.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bloomctl"
MAX_FUNCTION_LINES = 80
# What `bloomctl --help` must not load: the Redis client, the renderers, the SQL stack, the library rooms.
HEAVY = (
    "redis",
    "hiredis",
    "rich",
    "tqdm",
    "sqlalchemy",
    "psycopg",
    "pymysql",
    "bloomctl.backends",
    "bloomctl.rebuild",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(module_name(path) for path in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_every_module_imports_on_its_own(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> set[str]:
    """The bloomctl modules ``path`` imports, anywhere in it (annotations-only imports excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from bloomctl import backends` imports the module bloomctl.backends
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
    return {name for name in found if name in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles_not_even_inside_functions():
    graph = {module_name(path): imports_of(path) - {module_name(path)} for path in PACKAGE.rglob("*.py")}
    graph = {module: {dep for dep in deps if dep != "bloomctl"} for module, deps in graph.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def layer_order() -> list[str]:
    """The folders of docs/architecture.md, bottom to top, as its headings list them."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    headings = re.findall(r"^### `([a-z_]+)/`", page, re.M)  # a folder's subfolders are of its layer
    return [folder for folder in headings if folder != "bloomctl"]


def layer_of(module: str, layers: list[str]) -> int:
    """The index of the deepest folder that holds ``module`` (-1: the top level)."""
    inside = [
        i for i, layer in enumerate(layers) if module == f"bloomctl.{layer}" or module.startswith(f"bloomctl.{layer}.")
    ]
    return max(inside, key=lambda i: len(layers[i]), default=-1)


def layer_violations(layers: list[str], graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module, layers)
        if mine < 0:  # the top level: defaults, errors and keys import nothing above; the rest re-exports
            continue
        found += [f"{module} -> {dep}" for dep in sorted(deps) if layer_of(dep, layers) > mine]
    return found


def test_each_folder_imports_only_the_folders_below_it():
    layers = layer_order()
    assert layers[:3] == ["sizing", "server", "backends"] and layers[-1] == "cli"
    graph = {module_name(path): imports_of(path) - {module_name(path)} for path in PACKAGE.rglob("*.py")}
    assert layer_violations(layers, graph) == []


def test_the_layer_check_finds_an_import_from_above():
    layers = ["sizing", "lifecycle", "rebuild"]
    graph = {"bloomctl.lifecycle.standby": {"bloomctl.rebuild.options", "bloomctl.sizing.bloom"}}
    graph["bloomctl.rebuild.build.client"] = {"bloomctl.rebuild.options", "bloomctl.lifecycle.lock"}
    graph["bloomctl.rebuild.run"] = {"bloomctl.rebuild.build.client", "bloomctl.lifecycle.standby"}
    assert layer_violations(layers, graph) == ["bloomctl.lifecycle.standby -> bloomctl.rebuild.options"]


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def loaded_modules(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_help_loads_only_the_light_modules():
    code = "from bloomctl.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    loaded = loaded_modules(code)
    heavy = sorted(name for name in loaded if any(name == h or name.startswith(h + ".") for h in HEAVY))
    assert heavy == []


def test_public_api_at_the_top_loads_lazily():
    assert "bloomctl.filters.bloom" not in loaded_modules("import bloomctl")
    loaded = loaded_modules("from bloomctl import Filter, ShardedFilter, open_filter, plan")
    assert {"bloomctl.filters.bloom", "bloomctl.sizing.bloom"} <= loaded
    import bloomctl
    from bloomctl import Filter, ShardedFilter, open_filter, plan
    from bloomctl.filters.bloom import Filter as DefinedFilter

    assert Filter is DefinedFilter and issubclass(ShardedFilter, Filter) and callable(open_filter)
    assert plan(1_000_000, 0.01).size_bytes == 1_378_568
    assert set(bloomctl.__all__) <= set(dir(bloomctl))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bloomctl.nope  # noqa: B018


# Code outside bloomctl/backends/ asks a backend to do the thing, never its name.


def _backend_names() -> set[str]:
    from bloomctl import backends

    return set(backends.names())


def _mentions_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return "backend" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "backend" in node.attr.lower()
    return False


def _is_backend_name(node: ast.AST) -> bool:
    """``backend.name``, ``self.backend.name``, ``chosen_backend.name``..., also in a tuple."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_backend_name(element) for element in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == "name" and _mentions_backend(node.value)


def _holds_a_name(node: ast.AST) -> bool:
    """What a backend's name is compared through: ``x.name``, or a variable or field called ``*backend*``."""
    return (isinstance(node, ast.Attribute) and node.attr == "name") or _mentions_backend(node)


def _is_name_literal(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_name_literal(element, names) for element in node.elts)
    return False


def backend_name_comparisons(source: str, names: set[str]) -> list[int]:
    """The lines of ``source`` that compare a backend's name: with ``backend.name`` on one side, or
    a backend's name as a literal on one side and a name-holding expression on another."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literal = any(_is_name_literal(side, names) for side in sides)
        if any(_is_backend_name(side) for side in sides) or (literal and any(_holds_a_name(s) for s in sides)):
            found.append(node.lineno)
    return found


def test_no_code_outside_the_backends_compares_a_backends_name():
    names = _backend_names()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith("bloomctl/backends/"):
            continue
        found += [f"{where}:{line}" for line in backend_name_comparisons(path.read_text(encoding="utf-8"), names)]
    assert found == []


def test_the_name_comparison_counter_finds_one():
    names = _backend_names()
    assert backend_name_comparisons('if backend.name == "bitmap":\n    pass\n', names) == [1]
    assert backend_name_comparisons('x = self.backend.name in ("redisbloom", "lua-cuckoo")\n', names) == [1]
    assert backend_name_comparisons('ok = "lua-cuckoo" != chosen.name\n', names) == [1]
    assert backend_name_comparisons('grows = state.backend != "redisbloom"\n', names) == [1]
    assert backend_name_comparisons("if requested not in (AUTO, backend.name):\n    pass\n", names) == [1]
    assert backend_name_comparisons('if server.flavour == "redisbloom" or backend.overfills:\n    pass\n', names) == []


def test_the_old_cuckoo_module_still_exports_its_names():
    """``bloomctl.backends.cuckoo`` was split in three; code written against it keeps working."""
    from bloomctl.backends import cuckoo, cuckoo_base, cuckoo_lua, cuckoo_redisbloom

    assert cuckoo.lua_positions is cuckoo_lua.lua_positions
    assert cuckoo.LuaCuckoo is cuckoo_lua.LuaCuckoo and cuckoo.RedisBloomCuckoo is cuckoo_redisbloom.RedisBloomCuckoo
    assert cuckoo.CuckooBackend is cuckoo_base.CuckooBackend
    for name in (
        "CF_HEADER",
        "LUA_MAGIC",
        "LUA_FORMAT",
        "LUA_HEADER",
        "LUA_BATCH_SIZE",
        "LARGE_RESERVE",
        "SLICE",
        "CuckooBackend",
        "RedisBloomCuckoo",
        "LuaCuckoo",
        "parse_cf_header",
        "cf_size_bytes",
        "parse_lua_header",
        "recognise_lua",
        "lua_positions",
        "translate_cuckoo_error",
        "plan_for",
    ):
        assert hasattr(cuckoo, name), name


MAX_FUNCTIONS_RETURNING_ANY = 10  # a raw RESP reply, a module's __getattr__: where the value really is anything


def _returns_any(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    returns = node.returns
    if isinstance(returns, ast.Constant):  # a quoted annotation
        return returns.value in ("Any", "typing.Any")
    if isinstance(returns, ast.Name):
        return returns.id == "Any"
    return isinstance(returns, ast.Attribute) and returns.attr == "Any" and ast.unparse(returns.value) == "typing"


def test_at_most_10_functions_return_any():
    """Module boundaries carry real types: ``-> Any`` only where the value really is anything."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _returns_any(node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert len(found) <= MAX_FUNCTIONS_RETURNING_ANY, f"{len(found)} functions return Any:\n" + "\n".join(found)


def test_the_any_counter_finds_one():
    sources = ("def f() -> Any: ...", "def f() -> typing.Any: ...", "async def f() -> 'Any': ...")
    others = ("def f() -> AnyPlan: ...", "def f() -> list[Any]: ...", "def f(x: Any) -> int: ...")
    assert [_returns_any(ast.parse(source).body[0]) for source in sources + others] == [True] * 3 + [False] * 3


MAX_MODULE_LINES = 700  # past this, a module has usually taken on a second job
MAX_TEST_MODULE_LINES = 900  # test files are grouped by subject; past this, one holds several


def _longer_than(folder: Path, limit: int) -> list[str]:
    lengths = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in sorted(folder.rglob("*.py"))}
    return [f"{path.relative_to(ROOT)}: {lines} lines" for path, lines in lengths.items() if lines > limit]


def test_no_module_is_longer_than_700_lines():
    assert not _longer_than(PACKAGE, MAX_MODULE_LINES)


def test_no_test_file_is_longer_than_900_lines():
    assert not _longer_than(ROOT / "tests", MAX_TEST_MODULE_LINES)
