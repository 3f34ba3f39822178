"""The package's shape: imports go one way (no circle between modules, lazy imports inside functions included), and
the inference runtime imports nothing above it (docs/architecture.md)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mgeo_index"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports anywhere in its source (at the top or inside functions)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                found = known(target) if target.startswith("mgeo_index") else None
                if found and found != name:
                    graph[name].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_imports_nothing_above_it_but_settings_and_files():
    graph = import_graph()
    allowed = {"mgeo_index", "mgeo_index.settings", "mgeo_index.files"}
    for name, imported in graph.items():
        if name.startswith("mgeo_index.runtime"):
            assert {m for m in imported if not m.startswith("mgeo_index.runtime")} <= allowed, name


def test_models_load_through_one_door():
    """load_bi_encoder / load_cross_encoder are called by mgeo_index.model.loading alone (training aside): every
    other load goes through it (stored_bi / stored_cross, load_bi / load_cross, load_for_index)."""
    door = {"mgeo_index.model.loading", "mgeo_index.model.bi_encoder", "mgeo_index.model.cross_encoder"}
    loaders = {"load_bi_encoder", "load_cross_encoder"}
    found = []
    for name, path in _modules().items():
        if name in door or name.startswith("mgeo_index.training"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            used = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                    else None)
            named = [alias.name for alias in node.names] if isinstance(node, ast.ImportFrom) else []
            if used in loaders or loaders & set(named):
                found.append(f"{name}:{node.lineno}")
    assert not found, f"models loaded around mgeo_index.model.loading: {found}"


def _imports_outside(prefix: str, allowed: set[str]) -> dict[str, set[str]]:
    """The modules under ``prefix`` importing a package module that is neither under it nor in ``allowed``
    (packages named by their prefix, single modules by name)."""
    def ok(module: str) -> bool:
        return module == "mgeo_index" or any(module == a or module.startswith(a + ".") for a in allowed | {prefix})

    return {name: bad for name, imported in import_graph().items() if name.startswith(prefix)
            if (bad := {m for m in imported if not ok(m)})}


def test_the_models_read_comparisons_not_the_query_chain():
    """model/ stands below query/: the features its heads read come from compare/ (docs/architecture.md)."""
    allowed = {"mgeo_index.compare", "mgeo_index.runtime", "mgeo_index.text", "mgeo_index.store", "mgeo_index.heap",
               "mgeo_index.settings", "mgeo_index.files"}
    assert _imports_outside("mgeo_index.model", allowed) == {}


def test_comparisons_read_parsed_text_alone():
    assert _imports_outside("mgeo_index.compare", {"mgeo_index.text", "mgeo_index.settings"}) == {}


def test_the_import_check_sees_an_upward_import():
    graph = import_graph()
    assert "mgeo_index.compare.features" in graph["mgeo_index.query.labelling"] or \
        "mgeo_index.compare.conflicts" in graph["mgeo_index.query.labelling"]
    assert _imports_outside("mgeo_index.query", {"mgeo_index.text"})  # query reads model, compare, …


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_a_screen():
    """Functions of the package stay at most MAX_FUNCTION_LINES lines (signature and docstring included): longer
    ones are cut into named steps."""
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long
