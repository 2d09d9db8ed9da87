"""The package's layers, read from the source: the core imports no framework, no module imports
another in a cycle (across subpackages, or inside one: a module reading back from its own package's
``__init__``), and the old public module paths lead to the new ones."""

import ast
from pathlib import Path

import networkx as nx
import pytest
import tomllib

import verl_avspo

PACKAGE = Path(verl_avspo.__file__).parent
ROOT = PACKAGE.parent
FRAMEWORKS = ("verl", "ray", "transfer_queue", "openrlhf", "deepspeed", "vllm", "sglang")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Every module ``path`` imports, anywhere in it (top level or inside a function), absolute."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]  # from pkg import module
    return found


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_the_layers_are_folders():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} >= {
        "core",
        "verl_plugin",
        "openrlhf",
        "sandbox",
        "tools",
    }
    assert not [p.name for p in PACKAGE.glob("*.py")] or {p.name for p in PACKAGE.glob("*.py")} == {
        "__init__.py",
        "__main__.py",
        "cli.py",
        "main_ppo.py",
    }


@pytest.mark.parametrize("name", [name for name in MODULES if name.startswith("verl_avspo.core")])
def test_core_imports_no_framework(name):
    bad = [
        f"line {line}: {imported}"
        for imported, line in imports_of(MODULES[name])
        if imported.split(".")[0] in FRAMEWORKS
        or (imported.startswith("verl_avspo.") and not imported.startswith("verl_avspo.core"))
    ]
    assert not bad, f"{name} imports outside the framework-free core: {bad}"


# The host adapters sit on the core only: the tools and the sandbox sit above them and may import them, not back.
HOSTS = ("verl_avspo.verl_plugin", "verl_avspo.openrlhf", "verl_avspo.trl")
ABOVE_HOSTS = ("verl_avspo.tools", "verl_avspo.sandbox")


@pytest.mark.parametrize("name", [name for name in MODULES if name.startswith(HOSTS)])
def test_host_adapters_import_no_layer_above_them(name):
    bad = [
        f"line {line}: {imported}" for imported, line in imports_of(MODULES[name]) if imported.startswith(ABOVE_HOSTS)
    ]
    assert not bad, f"{name} imports a layer above the host adapters: {bad}"


def test_the_scan_sees_imports_inside_functions(tmp_path):
    # The control for the test above: a lazy import is found, and a relative one is resolved.
    source = tmp_path / "verl_avspo" / "core" / "probe.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    import verl.trainer\n    from . import virtual\n")
    found = [name for name, _ in imports_of(source, root=tmp_path)]
    assert found == ["verl.trainer", "verl_avspo.core", "verl_avspo.core.virtual"]


def import_graph(modules: dict[str, Path], root: Path = ROOT) -> nx.DiGraph:
    """Module ``a`` -> module ``b`` where ``a`` imports ``b``: ``import x.y`` and ``from x.y import
    name`` need the module ``x.y``; ``from x import y`` needs the package ``x``'s namespace, and the
    module ``x.y`` where there is one. Importing ``x.y`` also runs ``x``'s ``__init__`` first, but
    that is no edge: a package's ``__init__`` importing its own modules is the normal pattern, and
    one of them reading back from the package is the cycle (it depends on the ``__init__``'s order)."""
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for imported, _ in imports_of(path, root):
            if imported in modules and imported != name:
                graph.add_edge(name, imported)
    return graph


def test_no_import_cycle_in_the_package():
    cycles = list(nx.simple_cycles(import_graph(MODULES)))
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_check_sees_a_module_reading_back_from_its_own_package(tmp_path):
    # The control for the test above: inside one subpackage, __init__ importing its modules is
    # fine, a module importing a sibling is fine, and a module importing from the package is a cycle.
    checks = tmp_path / "verl_avspo" / "plugin" / "checks"
    checks.mkdir(parents=True)
    (checks.parent / "__init__.py").write_text("")
    (checks / "__init__.py").write_text("from verl_avspo.plugin.checks.settings import check\n")
    (checks / "resources.py").write_text("def gpus():\n    return 0\n")
    (checks / "settings.py").write_text("from verl_avspo.plugin.checks.resources import gpus\n")
    modules = {module_name(path, tmp_path): path for path in sorted(tmp_path.rglob("*.py"))}
    assert not list(nx.simple_cycles(import_graph(modules, tmp_path)))
    (checks / "settings.py").write_text("from verl_avspo.plugin.checks import resources\n")
    cycles = [sorted(cycle) for cycle in nx.simple_cycles(import_graph(modules, tmp_path))]
    assert cycles == [["verl_avspo.plugin.checks", "verl_avspo.plugin.checks.settings"]]


@pytest.mark.verl
def test_the_entry_point_is_the_verl_plugin_register_module():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["entry-points"]["verl.plugins"] == {"avspo": "verl_avspo.verl_plugin.register"}
