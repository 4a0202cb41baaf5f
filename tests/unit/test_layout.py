"""The package's floor plan: every import points down, and each module has a name of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import jupyter_gpumem

ROOT = Path(jupyter_gpumem.__file__).parent

# Lowest floor first. A module may import its own floor and the floors below it, never above.
# Prefixes name a package's modules (the longest prefix wins, so a room may span floors); within a
# floor, imports go either way, and test_no_import_circle keeps them from making a circle.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("units", "records", "version", "gc_pause"),
    ("held.tensor_walk", "held.namespace_scan"),
    ("nvml.",),
    ("techniques.",),
    ("tracking.",),
    ("analysis.",),
    ("report.svg", "report.text"),
    ("report.html",),
    ("report.record",),
    ("report.build", "report"),
    ("held.ipython_refs", "held", "logbook.", "workers."),
    ("session",),
    ("tuner.rng", "tuner.workload", "tuner.progress"),
    ("tuner.estimation.unfakeable",),
    ("tuner.estimation.storage_log", "tuner.estimation.search", "tuner.estimation.known_values"),
    ("tuner.estimation.cuda_like", "tuner.estimation.worker_process", "tuner.estimation.forked"),
    (
        "tuner.estimation.kernel_temporaries",
        "tuner.estimation.output_order",
        "tuner.estimation.grad_sums",
        "tuner.estimation.foreach_groups",
        "tuner.estimation.workspace_probes",
        "tuner.estimation.quantized",
        "tuner.estimation.untraced",
        "tuner.estimation.stand_ins",
        "tuner.estimation.reduce_buffers",
        "tuner.estimation.shard_pieces",
        "tuner.estimation.block_replay",
        "tuner.estimation.cuda_autocast",
        "tuner.estimation.cuda_attention",
        "tuner.estimation.cuda_fused",
        "tuner.estimation.kernel_checks",
    ),
    ("tuner.estimation.fake_objects",),
    ("tuner.estimation.fake_step",),
    (
        "tuner.estimation.fake_group",
        "tuner.estimation.allocator_model",
        "tuner.estimation.repeated_steps",
        "tuner.estimation.decode_steps",
    ),
    ("tuner.estimation.fake_peaks",),
    ("tuner.estimation.cards", "tuner.estimation.nccl"),
    ("tuner.estimation.verdict", "tuner.estimation.cuda_stand_in", "tuner.estimation.graph_pool"),
    ("tuner.estimation.estimate",),
    ("tuner.estimation.on_card",),
    ("tuner.estimation.rank_estimates", "tuner.estimation.without_cuda"),
    ("tuner.estimation.predict",),
    ("tuner.estimation.generation", "tuner.estimation"),
    # A widget below the widgets' floor: GenerateMap.chart() draws the map with it.
    ("widgets.generate_chart",),
    ("tuner.estimation.generate_map",),
    ("tuner.results", "tuner.step_change"),
    ("tuner.saved_state",),
    ("tuner.steps",),
    ("tuner.rank_payload", "tuner.forked_ranks"),
    ("tuner.runner",),
    (
        "tuner.planning.anchor_memo",
        "tuner.planning.anchors_at_once",
        "tuner.planning.solver",
        "tuner.planning.blocks_at_peak",
        "tuner.planning.fit",
        "tuner.planning.composed",
    ),
    ("tuner.planning.profile",),
    ("tuner.planning.reasoning",),
    ("tuner.planning.unmeasured",),
    ("tuner.planning.plan", "tuner.planning"),
    ("tuner.planning.joint",),
    ("tuner.trial",),
    ("tuner",),
    ("widgets.",),
    ("ipython.cell_options", "ipython.cell_run", "ipython.monitor_options"),
    ("ipython.display",),
    ("ipython.magic", "ipython"),
    ("server.",),
    ("", "__main__"),  # the package's entry points
)


def _floor(module: str) -> int:
    name = module.removeprefix("jupyter_gpumem").removeprefix(".")
    best: tuple[int, int] | None = None  # (prefix length, floor): the longest prefix wins
    for floor, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            package = prefix.endswith(".") and (name + ".").startswith(prefix)
            if name == prefix or package:
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), floor)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS")
    return best[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, module: str, *, type_only: bool = False) -> list[tuple[str, int]]:
    """Our modules that ``path`` imports at run time (at any depth), with their line; with
    ``type_only``, also those it imports only for type hints."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node) and not type_only:
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                is_module = (ROOT.parent / target.replace(".", "/")).with_suffix(".py").exists()
                is_package = (ROOT.parent / target.replace(".", "/") / "__init__.py").exists()
                found.append((target if is_module or is_package else base, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(name, line) for name, line in found if name.split(".")[0] == "jupyter_gpumem"]


def _modules() -> list[tuple[Path, str]]:
    return [(p, _module_name(p)) for p in sorted(ROOT.rglob("*.py"))]


def _upward(path: Path, module: str) -> list[str]:
    return [
        f"{path.name}:{line} {module} -> {target}"
        for target, line in _imports(path, module)
        if _floor(target) > _floor(module)
    ]


def test_every_import_points_down() -> None:
    upward = [line for path, module in _modules() for line in _upward(path, module)]
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_the_check_sees_upward_imports_also_inside_functions(tmp_path: Path) -> None:
    lazy = tmp_path / "lazy.py"
    lazy.write_text(
        "from typing import TYPE_CHECKING\n"
        "from jupyter_gpumem.units import format_bytes\n"
        "if TYPE_CHECKING:\n"
        "    from jupyter_gpumem.report.record import Report\n"
        "def f():\n"
        "    from jupyter_gpumem.widgets import charts\n"
    )
    assert _imports(lazy, "jupyter_gpumem.records") == [
        ("jupyter_gpumem.units", 2),
        ("jupyter_gpumem.widgets.charts", 6),
    ]
    assert _upward(lazy, "jupyter_gpumem.records") == [
        "lazy.py:6 jupyter_gpumem.records -> jupyter_gpumem.widgets.charts"
    ]
    assert _floor("jupyter_gpumem.report") > _floor("jupyter_gpumem.report.record")


def test_no_two_modules_share_a_file_name() -> None:
    names = Counter(p.name for p, _ in _modules() if p.name != "__init__.py")
    assert [n for n, count in names.items() if count > 1] == []


def test_records_import_nothing_of_ours() -> None:
    path = ROOT / "records.py"
    assert _imports(path, "jupyter_gpumem.records") == []


SHOWN = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_gpumem")
shell.run_cell("import torch")
shell.run_cell("%%gpumem\\nx = torch.ones(1000)\\nfor _ in range(3):\\n    y = x * 2\\n")
shell.run_cell("%gpumem history")
print(sorted(m for m in ("jupyter_server", "tornado", "bqplot") if m in sys.modules))
"""


@pytest.mark.timeout(120)
def test_a_gpumem_cell_imports_no_server_and_no_bqplot() -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-c", SHOWN], capture_output=True, text=True, timeout=110, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def _graph(*, type_only: bool) -> dict[str, set[str]]:
    """Our modules and those each imports: at run time, or also under ``TYPE_CHECKING``."""
    graph: dict[str, set[str]] = {}
    for path, module in _modules():
        found = _imports(path, module, type_only=type_only)
        graph[module] = {target for target, _ in found if target != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_at_run_time() -> None:
    assert _circles(_graph(type_only=False)) == []


def test_at_most_one_circle_through_type_hints() -> None:
    # The report record renders itself with html and text, whose functions take the record.
    assert _circles(_graph(type_only=True)) in (
        [],
        [
            [
                "jupyter_gpumem.report.html",
                "jupyter_gpumem.report.record",
                "jupyter_gpumem.report.text",
            ]
        ],
    )


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_at_most_eight_modules_at_the_top() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 8, top
