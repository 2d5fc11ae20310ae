"""The architecture picture (README, docs/architecture.md) is the package's import graph: the imports
between its top-level parts, read from the source, are exactly the arrows the docs draw or list."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "specfold_compile"

# part -> the parts it imports (the drawn arrows and the ones the text under the picture lists)
DOCUMENTED = {
    "testing": {"backend", "kernels", "models", "ops", "reference"},
    "cli": {"backend", "decoding", "eval", "loading", "models", "serving", "tasks"},
    "eval": {"backend", "decoding", "loading", "reference", "tasks"},
    "training": {"decoding", "models", "tasks"},
    "serving": {"decoding", "models", "ops", "reference"},
    "decoding": {"json_input", "loading", "models"},
    "loading": {"json_input", "models"},
    "reference": {"kernels", "models"},
    "models": {"json_input", "ops"},
    "backend": {"kernels", "ops", "passes"},
    "passes": {"kernels", "ops"},
    "ops": {"kernels"},
}


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else path.stem


def _imported_parts(path: Path) -> set[str]:
    """The package's top-level parts that ``path`` imports (absolute or relative, at any depth)."""
    module = ["specfold_compile", *path.relative_to(PACKAGE).with_suffix("").parts]
    package = module[:-1]
    targets = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            named = node.module.split(".") if node.module else []
            if node.module:
                targets.append(base + named)
            else:
                targets += [base + [alias.name] for alias in node.names]
    return {t[1] for t in targets if len(t) > 1 and t[0] == "specfold_compile"}


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue  # the package's face re-exports from both towers
        part = _part(path)
        found = {p.removesuffix(".py") for p in _imported_parts(path)} - {part}
        if found:
            graph.setdefault(part, set()).update(found)
    return graph


def test_import_graph_is_the_documented_one():
    assert import_graph() == DOCUMENTED


def test_the_floor_imports_nothing_above_it():
    graph = import_graph()
    assert graph.get("ops", set()) <= {"kernels"} and "kernels" not in graph


def _picture(text: str) -> str:
    start = text.index("```\n          cli/")
    return text[start:text.index("```\n", start + 4)]


def test_readme_and_architecture_draw_the_same_picture():
    readme = (ROOT / "README.md").read_text()
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    assert _picture(readme) == _picture(architecture)
    for part in DOCUMENTED:
        assert part in _picture(readme), part
