"""The peak by module on the CPU: a tiny GPT's tree, a shared layer, code outside any module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.support.saved_bytes import saved_bytes_by_module

GPT = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=64, n_head=2, vocab_size=512))
batch = torch.randint(0, 512, (4, 64))
"""


@pytest.fixture
def gpt(shell: InteractiveShell) -> Iterator[InteractiveShell]:
    pytest.importorskip("transformers")
    assert shell.run_cell(GPT).success
    yield shell


def nonzero(amounts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in amounts.items() if v}


def assert_a_tree(r: object) -> None:
    """The root is the breakdown; every module holds at least what its children hold."""
    tree = r.module_tree  # type: ignore[attr-defined]
    assert r.by_module[""] == nonzero(r.breakdown)  # type: ignore[attr-defined]
    for m in tree.walk():
        for category, n in m.own().items():
            assert n > 0, (m.path, category, n)


def test_a_tiny_gpts_blocks_hold_what_their_forwards_saved(gpt: InteractiveShell) -> None:
    # Forward only, the loss kept: at the peak every block's saved tensors are alive.
    assert gpt.run_cell("%%gpumem -o r --quiet\nloss = model(batch, labels=batch).loss").success
    r = gpt.user_ns["r"]
    assert_a_tree(r)
    model = gpt.user_ns["model"]
    blocks = {f"transformer.h.{i}": block for i, block in enumerate(model.transformer.h)}
    del gpt.user_ns["loss"]
    expected, _ = saved_bytes_by_module(
        blocks, lambda: model(gpt.user_ns["batch"], labels=gpt.user_ns["batch"]).loss
    )
    got = {name: r.by_module[name].get("activations", 0) for name in blocks}
    assert got == expected and min(expected.values()) > 0
    # parameters belong to the module that owns them: each block's are its own
    for i, block in enumerate(model.transformer.h):
        own = sum(p.untyped_storage().nbytes() for p in block.parameters())
        assert r.by_module[f"transformer.h.{i}"]["parameters"] == own
    assert r.module_tree.largest() is not None
    assert "largest modules at the peak" in str(r)
    page = r._repr_mimebundle_()["text/html"]
    assert '<details open style="margin-left:0em" title="">' in page
    assert '<div style="margin-left:1.2em" title="transformer.h.0.mlp.act"><code>act</code>' in page


def test_a_training_step_puts_gradients_and_optimizer_state_with_their_parameters(
    gpt: InteractiveShell,
) -> None:
    cell = """%%gpumem -o r --quiet
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(batch, labels=batch).loss.backward()
    opt.step()
"""
    assert gpt.run_cell(cell).success
    r = gpt.user_ns["r"]
    assert_a_tree(r)
    head = gpt.user_ns["model"].transformer.h[1].mlp.c_fc
    nbytes = sum(p.untyped_storage().nbytes() for p in head.parameters())
    entry = r.by_module["transformer.h.1.mlp.c_fc"]
    steps = 4 * len(list(head.parameters()))  # AdamW's step counts: a float each
    assert entry["parameters"] == nbytes and entry["optimizer_state"] == 2 * nbytes + steps


SHARED = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
    def forward(self, x):
        return torch.tanh(self.fc(x))

class Looped(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(32, 4)
    def forward(self, x):
        for _ in range(3):
            x = self.block(x)
        return self.head(x)

def outside(y):  # a hand-written function, no module, which makes the peak
    return torch.sigmoid(y.repeat(1, 1024)).sum()

net = Looped()
x = torch.randn(256, 32)
"""


def test_a_block_called_three_times_is_counted_once_per_call(shell: InteractiveShell) -> None:
    assert shell.run_cell(SHARED).success
    assert shell.run_cell("%%gpumem -o r --quiet\nloss = outside(net(x))").success
    r = shell.user_ns["r"]
    assert_a_tree(r)
    calls = [f"block#{k}" for k in range(3)]
    tree = {m.path: m for m in r.module_tree.walk()}
    for label in calls:
        # each call's tanh saved its output, 256 x 32 floats; what its fc saved is the input,
        # the previous call's output (the first saver's) or the cell's own ``x`` (inputs)
        assert r.by_module[label]["activations"] == 256 * 32 * 4, (label, r.by_module)
    assert [m.path for m in r.module_tree.children] == [*calls, "head"]
    # the shared fc's parameters belong to it once, under the first call of its block
    fc = sum(p.untyped_storage().nbytes() for p in shell.user_ns["net"].block.fc.parameters())
    assert r.by_module["block.fc"]["parameters"] == fc
    assert [m.path for m in tree["block#0"].children] == ["block.fc"]
    # sigmoid's saved output, outside every module, stays with the root
    root_own = r.module_tree.own()
    assert root_own["activations"] == 256 * 4 * 1024 * 4


def test_a_report_without_module_calls_has_no_tree(shell: InteractiveShell) -> None:
    assert shell.run_cell("import torch").success
    assert shell.run_cell("%%gpumem -o r --quiet\ny = torch.ones(1000).exp()").success
    r = shell.user_ns["r"]
    assert r.module_tree is None and r.by_module is None
    assert r.to_dict()["devices"][0]["module_tree"] is None


def test_a_tied_weight_and_its_state_belong_to_its_first_owner(gpt: InteractiveShell) -> None:
    # GPT-2 ties lm_head.weight to transformer.wte.weight: named_parameters() names it once, wte
    cell = """%%gpumem -o r --quiet
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(batch, labels=batch).loss.backward()
    opt.step()
"""
    assert gpt.run_cell(cell).success
    r = gpt.user_ns["r"]
    nbytes = gpt.user_ns["model"].transformer.wte.weight.untyped_storage().nbytes()
    wte = r.by_module["transformer.wte"]
    assert wte["parameters"] == nbytes and wte["optimizer_state"] == 2 * nbytes + 4
    assert "optimizer_state" not in r.by_module.get("lm_head", {})
