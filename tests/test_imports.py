"""The package's import graph: no circles, and the capture compiler's stages in one line.

Every `import` / `from ... import` in every .py under mla_func/ counts, at module level or
inside a function (a lazy import still ties two modules together). An import of `mla_func.a.b`,
or `from mla_func.a import b`, is an edge to the module `mla_func.a.b` where it exists, else to
the nearest enclosing module that does (`mla_func.a`); a package's `__init__.py` is the module
named after the package. Importing `mla_func.a.b` implies no edge to `mla_func.a`.
"""

import ast
from pathlib import Path

PACKAGE = "mla_func"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


# The capture compiler's stages in order: each may import only stages before it.
CAPTURE_LINE = ("signature", "trace", "split", "purity", "validate", "plan", "segments",
                "capture", "dispatch", "compile", "artifacts", "interop")
# Utilities any stage may import; they import no stage.
CAPTURE_LEAVES = ("buckets", "errors", "tree")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _nearest(name: str, known: dict[str, Path]) -> str | None:
    while name not in known:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _source(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The absolute module a `from ... import` statement in module `name` imports from."""
    if not node.level:
        return node.module or ""
    # Relative: from the importing module's package, one level up per extra dot.
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that `name` (at `path`) imports anywhere in its file."""
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _source(node, name, path)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.append(sub if sub in known else source)
    found = {_nearest(t, known) for t in targets if t.split(".")[0] == PACKAGE}
    return {t for t in found if t is not None and t != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the strongly connected components, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def _cycle_in(component: list[str], edges: dict[str, set[str]]) -> str:
    """One circle through the component's first module, as `a -> b -> a` (for the message)."""
    members, start = set(component), component[0]
    paths, seen = {start: [start]}, {start}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == start:
                    return " -> ".join(paths[node] + [start])
                if child not in seen:
                    seen.add(child)
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    return ", ".join(component)


def test_tarjan_finds_components():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(strongly_connected(edges)) == [["a", "b", "c"], ["d"], ["e"]]


def test_the_scan_sees_lazy_and_relative_imports():
    edges = graph()
    assert "mla_func.config" in edges["mla_func"]  # the package's __init__
    assert "mla_func.capture.plan" in edges["mla_func.capture.compile"]
    assert "mla_func.dims" in edges["mla_func.capture.plan"]  # inside plan_capture

    def source(line: str, name: str, file: str) -> str:
        return _source(ast.parse(line).body[0], name, Path(file))

    assert source("from ..dims import X", "mla_func.capture.plan", "plan.py") == "mla_func.dims"
    assert source("from . import tree", "mla_func.capture", "__init__.py") == "mla_func.capture"
    assert source("from .. import dims", "mla_func.capture", "__init__.py") == "mla_func"


def test_no_import_cycles():
    edges = graph()
    cycles = [c for c in strongly_connected(edges) if len(c) > 1]
    assert not cycles, "import cycles (strongly connected components):\n" + "\n".join(
        f"  {{{', '.join(c)}}}: {_cycle_in(c, edges)}" for c in cycles)


def test_modules_import_concrete_modules_not_the_face():
    """`from mla_func import model` reaches `model` through the package face; package modules
    name the module itself (`import mla_func.model as model`), so that the face may import
    any of them."""
    found = []
    for name, path in modules().items():
        if name == PACKAGE:  # the face itself imports the modules it re-exports
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import) and any(a.name == PACKAGE for a in node.names):
                found.append(f"{name}:{node.lineno}: import {PACKAGE}")
            elif isinstance(node, ast.ImportFrom) and _source(node, name, path) == PACKAGE:
                names = ", ".join(a.name for a in node.names)
                found.append(f"{name}:{node.lineno}: from {PACKAGE} import {names}")
    assert not found, "\n".join(found)


def test_capture_stages_form_a_line():
    edges = graph()
    prefix = f"{PACKAGE}.capture"
    stages = {f"{prefix}.{s}" for s in CAPTURE_LINE}
    leaves = {f"{prefix}.{s}" for s in CAPTURE_LEAVES}
    inside = {m for m in edges if m == prefix or m.startswith(f"{prefix}.")}
    assert stages | leaves | {prefix} == inside, (
        "a new module in mla_func/capture/: place it in CAPTURE_LINE or CAPTURE_LEAVES")
    wrong = []
    for i, stage in enumerate(CAPTURE_LINE):
        allowed = {f"{prefix}.{s}" for s in CAPTURE_LINE[:i]} | leaves
        for target in sorted(edges[f"{prefix}.{stage}"]):
            if target.startswith(prefix) and target not in allowed:
                wrong.append(f"{stage} imports {target} (not before it in the line)")
    for leaf in sorted(leaves):
        wrong += [f"{leaf} imports {t} (a leaf utility imports no stage)"
                  for t in sorted(edges[leaf] & (stages | {prefix}))]
    assert not wrong, "\n".join(wrong)
