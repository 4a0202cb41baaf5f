"""The peak by module from recorded calls: labels, nesting, owners and the root."""

from __future__ import annotations

from jupyter_gpumem.analysis.by_module import (
    ModuleTally,
    module_bytes_from_dict,
    module_tree,
)
from jupyter_gpumem.records import ModuleCall, ScopeMark

# the model (0), its block called twice (1, 3) with a child each time (2, 4), an owner (5)
CALLS = (
    ModuleCall("", 0, -1),
    ModuleCall("block", 0, 0),
    ModuleCall("block.fc", 0, 1),
    ModuleCall("block", 1, 0),
    ModuleCall("block.fc", 1, 3),
    ModuleCall("block.fc", -1, -1),
    ModuleCall("head", 0, 0),
)


def tally(**by_scope: dict[str, int]) -> ModuleTally:
    t = ModuleTally(CALLS, (ScopeMark(10, 0), ScopeMark(20, 1), ScopeMark(30, -1)))
    for scope, amounts in by_scope.items():
        for category, n in amounts.items():
            t.add(int(scope[1:]), category, n)
    return t


def test_a_repeated_call_reads_with_its_index_and_holds_its_childrens_bytes() -> None:
    t = tally(s2={"activations": 10}, s4={"activations": 20}, s3={"temporary": 5})
    tree = module_tree(t, {"activations": 30, "temporary": 5, "other": 1})
    flat = tree.flat()
    assert flat == {
        "": {"activations": 30, "temporary": 5, "other": 1},
        "block#0": {"activations": 10},
        "block.fc#0": {"activations": 10},
        "block#1": {"activations": 20, "temporary": 5},
        "block.fc#1": {"activations": 20},
    }
    assert tree.own() == {"other": 1}
    assert tree.largest() is not None and tree.largest().path == "block.fc#1"


def test_an_owner_of_parameters_hangs_under_its_modules_first_call() -> None:
    tree = module_tree(tally(s5={"parameters": 8}, s6={"parameters": 4}), {"parameters": 12})
    by_path = {m.path: m for m in tree.walk()}
    assert [c.path for c in by_path["block#0"].children] == ["block.fc"]
    assert [c.path for c in tree.children] == ["block#0", "head"]


def test_library_buffers_slack_and_code_outside_modules_stay_with_the_root() -> None:
    t = tally()
    for category in ("library_workspace", "cuda_graph_pool", "allocator_slack"):
        t.add(2, category, 100)
    t.add(-1, "temporary", 7)
    t.add(99, "temporary", 7)  # no such call
    assert t.by_scope == {}
    tree = module_tree(t, {"library_workspace": 300, "temporary": 14})
    assert tree.children == () and tree.own() == {"library_workspace": 300, "temporary": 14}


def test_the_call_running_at_a_time_comes_from_the_marks() -> None:
    t = tally()
    assert [t.scope_at(us) for us in (5, 10, 25, 30, 99)] == [-1, 0, 1, -1, -1]


def test_parents_that_loop_do_not_hang_the_tree() -> None:
    calls = (ModuleCall("a", 0, 1), ModuleCall("b", 0, 0))
    t = ModuleTally(calls, ())
    t.add(0, "activations", 3)
    t.add(1, "activations", 4)
    tree = module_tree(t, {"activations": 7})
    assert sorted(m.path for m in tree.walk()) == ["", "a", "b"]
    assert sum(m.bytes["activations"] for m in tree.children) == 7


def test_the_tree_reads_back_from_its_wire_format() -> None:
    tree = module_tree(
        tally(s2={"activations": 10}, s6={"parameters": 4}), {"activations": 10, "parameters": 4}
    )
    assert module_bytes_from_dict(tree.to_dict()) == tree
