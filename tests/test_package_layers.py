"""The package's three layers, read from its import statements: no import circle, and dependencies that
point one way (pytest adapter -> engine -> result values)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_autograd"
ADAPTER = ("pytest_autograd.plugin", "pytest_autograd.pytest_adapter")
ENGINE = ("pytest_autograd.engine", "pytest_autograd.checks", "pytest_autograd.bench")
RESULTS = ("pytest_autograd.results",)
PYTEST_MODULES = ("pytest", "_pytest", "pluggy")


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports():
    """module -> the set of modules it imports, at the top or inside a function."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    found = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in modules else node.module)
        found[name] = targets
    return found


def inside(name, layer):
    return any(name == prefix or name.startswith(prefix + ".") for prefix in layer)


def cycles(graph):
    """Every strongly connected group of two or more modules (Tarjan)."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def package_edges():
    graph = imports()
    return {name: {target for target in targets if target.startswith("pytest_autograd")}
            for name, targets in graph.items()}


def test_no_module_of_the_package_takes_part_in_an_import_circle():
    graph = package_edges()
    # a package's __init__ importing its own modules is how packages work, not a circle
    for name in graph:
        graph[name] = {target for target in graph[name] if not name.startswith(target + ".")}
    assert cycles(graph) == []


def test_the_engine_checks_bench_and_results_never_import_pytest_or_the_adapter():
    wrong = []
    for name, targets in imports().items():
        if not (inside(name, ENGINE) or inside(name, RESULTS)):
            continue
        for target in targets:
            if target.split(".")[0] in PYTEST_MODULES or inside(target, ADAPTER):
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_result_values_depend_on_nothing_else_in_the_package():
    wrong = [f"{name} imports {target}" for name, targets in package_edges().items() if inside(name, RESULTS)
             for target in targets if not inside(target, RESULTS)]
    assert wrong == []


def test_every_module_belongs_to_one_layer():
    loose = [name for name in imports() if name != "pytest_autograd"
             and not any(inside(name, layer) for layer in (ADAPTER, ENGINE, RESULTS))]
    assert loose == []
