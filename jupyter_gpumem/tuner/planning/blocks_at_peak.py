"""Each block's activation bytes at the peak of a measured run, read from its report.

The report's peak by module (``Report.by_module``) names a block called more than once in a
step ``name#k`` per call; a block's figure is the sum over its calls. A report without the
peak by module (a run with counters only) gives no figures at all, rather than zeros.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jupyter_gpumem.analysis.by_module import ModuleBytes
from jupyter_gpumem.report.record import Report

_CALL = re.compile(r"#\d+$")


def block_activations(report: Report | None, names: Sequence[str]) -> dict[str, int]:
    """``{block: activation bytes at the peak}`` for each of ``names``; ``{}`` when unknown."""
    tree = None if report is None else report.module_tree
    if tree is None or not names:
        return {}
    out = dict.fromkeys(names, 0)

    def visit(node: ModuleBytes, counted: frozenset[str]) -> None:
        # a node's bytes include its children's: a block is counted where it first appears
        name = _CALL.sub("", node.path)
        if name in out and name not in counted:
            out[name] += node.bytes.get("activations", 0)
            counted = counted | {name}
        for child in node.children:
            visit(child, counted)

    visit(tree, frozenset())
    return out
