"""The package layout rules of ARCHITECTURE.md, read from the source: no import cycle, no private name imported from
another module, folders a reader can scan, task names only in the task home, layers that import downwards.

Imports are parsed, not executed: every ``import`` statement counts, at module level, under ``TYPE_CHECKING`` or
inside a function, and so does the package ``__init__`` a dotted import runs first (``import a.b.c`` runs
``a/b/__init__.py``). The root ``yolo11_lightning/__init__.py`` is the one exception: its imports are lazy by design
(``__getattr__``), so nothing that imports a submodule runs them.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = "yolo11_lightning"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
MAX_MODULES_PER_FOLDER = 20
MAX_TASK_NAME_COMPARISONS = 3  # outside tasks/
TASK_HOME = f"{PACKAGE}.tasks"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, packages under their own name."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _task_names() -> set[str]:
    """The ``name`` of every task class under tasks/ (parsed: importing would hide a cycle behind its error)."""
    return {
        stmt.value.value
        for module, tree in TREES.items()
        if module.startswith(f"{PACKAGE}.tasks")
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign | ast.Assign)
        and "name"
        in [
            t.id
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
            if isinstance(t, ast.Name)
        ]
        and isinstance(stmt.value, ast.Constant)
    }


TASKS = _task_names()


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(target module, imported name or None) of one statement; targets resolved to modules of the package."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        if MODULES[module].name != "__init__.py":
            parts = parts[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return [
        (f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base, alias.name)
        for alias in node.names
    ]


def _packages_of(module: str) -> set[str]:
    """The packages ``module`` lies in (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = module.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts))}


def _edges(trees: dict[str, ast.AST]) -> dict[str, set[str]]:
    """Module -> the package modules its import statements run (``trees``: parsed modules by dotted name)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target, _ in _imported(module, node):
                if not target.startswith(PACKAGE):
                    continue
                while target not in MODULES and "." in target:
                    target = target.rsplit(".", 1)[0]
                # The target and the packages it runs first: not the root, nor a package of the importer itself
                # (that one already runs, whoever imports the importer).
                parts, own = target.split("."), _packages_of(module)
                runs = [".".join(parts[:k]) for k in range(2, len(parts) + 1)]
                edges[module].update(
                    t for t in runs if t in MODULES and t != module and (t == target or t not in own)
                )
    return edges


EDGES = _edges(TREES)


def _cycle() -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(EDGES.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(MODULES):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_rules_see_the_package() -> None:
    """The parser finds the modules and their imports (a rule over nothing would pass for nothing)."""
    assert len(MODULES) > 80 and sum(len(v) for v in EDGES.values()) > 200
    assert f"{PACKAGE}.nn.yolo11" in EDGES[f"{PACKAGE}.tasks"]  # a module-level import
    assert f"{PACKAGE}.metrics.detection" in EDGES[f"{PACKAGE}.tasks.base.evaluation"]  # function-local
    assert f"{PACKAGE}.structures" in EDGES[f"{PACKAGE}.data.augment.pipeline"]  # a package __init__ it runs


def test_no_import_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_private_name_is_imported_from_another_module() -> None:
    found = [
        f"{module} imports {name} from {target}"
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for target, name in _imported(module, node)
        if target.startswith(PACKAGE) and name and name.startswith("_") and not name.startswith("__")
    ]
    assert not found, (
        "private helpers belong in their module or a private _x.py of its package:\n" + "\n".join(found)
    )


def test_folders_hold_at_most_20_modules() -> None:
    per_folder: dict[str, int] = defaultdict(int)
    for path in MODULES.values():
        if path.name != "__init__.py":
            per_folder[str(path.parent.relative_to(ROOT.parent))] += 1
    crowded = {folder: n for folder, n in per_folder.items() if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"split these folders by stage: {crowded}"


def _task_name_comparisons(tree: ast.AST) -> list[int]:
    """Lines of comparisons with a task name: a registered name's literal or ``DEFAULT_TASK``."""

    def names_a_task(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in TASKS
        if isinstance(node, ast.Name | ast.Attribute):
            return (node.id if isinstance(node, ast.Name) else node.attr) == "DEFAULT_TASK"
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(names_a_task(e) for e in node.elts)
        return False

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(names_a_task(n) for n in (node.left, *node.comparators))
    ]


def _task_name_lists(tree: ast.AST) -> list[int]:
    """Lines of literals naming two or more tasks (a tuple, list, set or dict of task names spelled out)."""
    found = []
    for node in ast.walk(tree):
        elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if elements is None:
            continue
        names = [e.value for e in elements if isinstance(e, ast.Constant) and e.value in TASKS]
        if len(set(names)) >= 2:
            found.append(node.lineno)
    return found


def test_task_names_stay_in_the_task_home() -> None:
    outside = {m: t for m, t in TREES.items() if m != TASK_HOME and not m.startswith(TASK_HOME + ".")}
    comparisons = {m: lines for m, t in outside.items() if (lines := _task_name_comparisons(t))}
    assert sum(len(v) for v in comparisons.values()) <= MAX_TASK_NAME_COMPARISONS, (
        f"branch on the task through its spec (tasks.get_task(name)), not its name: {comparisons}"
    )
    lists = {m: lines for m, t in outside.items() if (lines := _task_name_lists(t))}
    assert not lists, f"the task names are tasks.TASKS, not a list of their own: {lists}"


def test_the_task_rules_would_catch_a_branch() -> None:
    code = "if task == 'segment' or cfg.task != DEFAULT_TASK or t in ('detect', 'depth'):\n    pass\nX = {'detect': 1, 'segment': 2}"
    tree = ast.parse(code)
    assert _task_name_comparisons(tree) == [1, 1, 1] and _task_name_lists(tree) == [3]
    assert {"detect", "segment"} <= TASKS


# The modules outside tasks/ that name a task option, and why; the others receive the task, or the options as one
# record (``Task.options_from`` / ``model_options``, ``data.sources.label_options.LabelOptions``).
OPTION = re.compile(r"\bkpt_shape\b")
MAX_OPTION_MODULES = 8
OPTION_MODULES = {
    "nn.yolo11": "the model's keypoint shape, read off the head it was built with (YOLO11.kpt_shape)",
    "model_files.exported_model": "the same attribute of an exported model, which the pose task reads",
    "data.sources.label_options": "the dataset yaml's keys, read and written by this one data module",
    "training.module": "the --model.kpt_shape hyper-parameter, a public config name",
    "training.datamodule": "checks the model and the dataset agree",
    "cli.lightning_cli": "fills --model.kpt_shape from the dataset when none is named",
}


def test_task_options_are_named_in_few_modules_outside_the_tasks() -> None:
    naming = {
        m.removeprefix(PACKAGE + ".")
        for m, path in MODULES.items()
        if m != TASK_HOME and not m.startswith(TASK_HOME + ".") and OPTION.search(path.read_text())
    }
    assert naming <= set(OPTION_MODULES), (
        f"hand the task or its options record on instead: {naming - set(OPTION_MODULES)}"
    )
    assert len(OPTION_MODULES) <= MAX_OPTION_MODULES


# The folders (and top-level modules) of the package, bottom to top: each imports only parts before it in this
# list. ARCHITECTURE.md draws the same order. The root ``__init__`` is left out: its imports are lazy.
FOLDER_ORDER = (
    "errors", "version", "extras",  # what every part may use
    "ops", "structures",  # box maths; labels, records and the batch contract
    "nn", "loss", "metrics", "plots",  # the network, its loss, evaluation, pictures
    "data",  # files -> records -> samples
    "tasks",  # one folder per task, plugging into all of the above
    "synthetic", "model_files",  # the built-in datasets; every model file read or written
    "training",  # the LightningModule, the LightningDataModule, callbacks
    "export", "predict",  # model files out; predictions
    "cli", "__main__",  # the entry points: the only code that resolves a run's task
)  # fmt: skip
# Finer rules inside the order. Keys: module prefixes; values: the only parts they may import.
ONLY_IMPORTS = {
    f"{PACKAGE}.nn": ("nn", "ops"),  # building a detector needs torch and box maths, nothing else
    f"{PACKAGE}.ops": ("ops",),
}
MUST_NOT_IMPORT = {
    f"{PACKAGE}.data.sources": ("data.dataset", "data.augment", "data.sampling"),
}


def _part(module: str) -> str:
    """The top-level folder or module of ``module`` (``yolo11_lightning.data.sources.yolo`` -> ``data``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_part_is_in_the_folder_order() -> None:
    parts = {_part(m) for m in MODULES} - {""}
    assert parts == set(FOLDER_ORDER), f"place these in FOLDER_ORDER: {parts ^ set(FOLDER_ORDER)}"


def _upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """``module -> target`` for every import of a part above the importer's part in ``FOLDER_ORDER``."""
    rank = {part: i for i, part in enumerate(FOLDER_ORDER)}
    return sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if _part(module)
        for target in targets
        if _part(target) and rank[_part(target)] > rank[_part(module)]
    )


def test_folders_import_only_folders_below_them() -> None:
    upward = _upward_imports(EDGES)
    assert not upward, "a part imports a part above it (FOLDER_ORDER):\n" + "\n".join(upward)


def test_the_folder_rule_would_catch_an_upward_import() -> None:
    """A function-local import of the LightningModule in the network, and a package import of the task
    registry under TYPE_CHECKING in ``ops``, are both reported; the rest of the package stays clean."""
    network, box_maths = f"{PACKAGE}.nn.yolo11", f"{PACKAGE}.ops.boxes"
    planted = dict(TREES)
    planted[network] = ast.parse(
        MODULES[network].read_text() + "\n\ndef _planted():\n    from ..training.module import YOLO11Module\n"
    )
    planted[box_maths] = ast.parse(
        MODULES[box_maths].read_text() + "\nif TYPE_CHECKING:\n    import yolo11_lightning.tasks\n"
    )
    assert _upward_imports(_edges(planted)) == [
        f"{network} -> {PACKAGE}.training",  # the package __init__ the import runs first
        f"{network} -> {PACKAGE}.training.module",
        f"{box_maths} -> {PACKAGE}.tasks",
    ]


@pytest.mark.parametrize("layer", sorted(ONLY_IMPORTS))
def test_the_lowest_parts_import_only_what_they_build_on(layer: str) -> None:
    allowed = tuple(f"{PACKAGE}.{a}" for a in ONLY_IMPORTS[layer])
    found = sorted(
        f"{module} -> {target}"
        for module, targets in EDGES.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if not any(target == a or target.startswith(a + ".") for a in allowed)
    )
    assert not found, f"{layer} imports outside {ONLY_IMPORTS[layer]}:\n" + "\n".join(found)


@pytest.mark.parametrize("layer", sorted(MUST_NOT_IMPORT))
def test_stages_import_downwards(layer: str) -> None:
    banned = tuple(f"{PACKAGE}.{b}" for b in MUST_NOT_IMPORT[layer])
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in EDGES.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned)
    )
    assert not upward, f"{layer} imports a stage after it:\n" + "\n".join(upward)


def test_tasks_reach_the_module_through_public_methods() -> None:
    """``module._x`` in a task's code would tie the task to the module's internals."""
    private = [
        f"{m}:{node.lineno} module.{node.attr}"
        for m, tree in TREES.items()
        if m.startswith(TASK_HOME)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "module"
        and node.attr.startswith("_")
    ]
    assert not private, private
