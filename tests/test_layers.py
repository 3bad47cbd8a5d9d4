"""The layers hold: every import between the project's own modules goes down (walked in the AST).

    _core  <-  transforms  <-  loading  <-  profile  <-  tune  <-  report  <-  front doors
           <-  integrations  <-  cli / demo / doctor / the package's face

Modules of one layer import each other freely; an import of a higher layer fails here, and so does
an import of the project's own modules inside a function (the lazy entry points aside: a package
``__init__``'s ``__getattr__``, and ``cli.py``, which loads a command's module when it runs).
"""

from __future__ import annotations

import ast
import pathlib

import pipeline_opt

PACKAGE = pathlib.Path(pipeline_opt.__file__).parent
LAYERS = (
    ("_core", ("_core/", "_version.py", "datasets.py")),
    ("transforms", ("transforms/",)),
    ("loading", ("loading/",)),
    ("profile", ("profile/",)),
    ("tune", ("tune/",)),
    ("report", ("report/",)),
    ("front doors", ("front_doors.py", "distributed_api.py")),
    ("integrations", ("integrations/",)),
    ("entry points", ("cli.py", "demo.py", "doctor.py", "__main__.py", "__init__.py")),
)
LAZY_ENTRY_POINTS = ("cli.py",)


def layer_of(rel: str) -> int:
    """The layer of a module path relative to the package (``tune/api.py``)."""
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes):
            return i
    raise AssertionError(f"{rel} belongs to no layer: add it to tests/test_layers.py LAYERS")


def _module_path(dotted: str) -> str | None:
    """``pipeline_opt.tune.api`` -> ``tune/api.py`` (a package -> its ``__init__.py``); None outside."""
    parts = dotted.split(".")
    if parts[0] != "pipeline_opt":
        return None
    if len(parts) == 1:
        return "__init__.py"
    base = PACKAGE.joinpath(*parts[1:])
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py").relative_to(PACKAGE).as_posix()
    if (base / "__init__.py").is_file():
        return (base / "__init__.py").relative_to(PACKAGE).as_posix()
    return None


def _imports(tree: ast.AST):
    """``(node, imported module path, inside a function)`` for every import of the project's modules."""
    def walk(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    path = _module_path(alias.name)
                    if path:
                        yield child, path, in_function
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for alias in child.names:  # ``from pipeline_opt.x import y``: y may be a module itself
                    path = _module_path(f"{child.module}.{alias.name}") or _module_path(child.module)
                    if path:
                        yield child, path, in_function
            yield from walk(child, inner)
    yield from walk(tree, False)


def _violations():
    upward, in_function = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        here = layer_of(rel)
        for node, target, inside in _imports(ast.parse(path.read_text(), filename=str(path))):
            there = layer_of(target)
            if there > here:
                upward.append(f"{rel}:{node.lineno} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
            if inside and not (rel.endswith("__init__.py") or rel in LAZY_ENTRY_POINTS):
                in_function.append(f"{rel}:{node.lineno} imports {target} inside a function")
    return upward, in_function


def test_imports_only_go_down_the_layers():
    upward, _ = _violations()
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_no_import_of_the_projects_own_modules_inside_a_function():
    _, inside = _violations()
    assert not inside, "\n".join(inside)


def test_the_walk_sees_every_import_form():
    code = ("import pipeline_opt.tune.api\nfrom pipeline_opt import report\nfrom pipeline_opt.profile import api\n"
            "def f():\n    from pipeline_opt.tune import search\n")
    found = [(target, inside) for _, target, inside in _imports(ast.parse(code))]
    assert found == [("tune/api.py", False), ("report/__init__.py", False), ("profile/api.py", False),
                     ("tune/search.py", True)]
    assert layer_of("tune/api.py") > layer_of("profile/report.py") > layer_of("loading/dataloader.py")
