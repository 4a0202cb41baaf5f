"""Record the report fixtures the front end's tests read, from real cells on the CPU.

    python bench/record_report_fixtures.py tests/fixtures

Writes ``report_gpu_generate.json`` (a tiny GPT-2's ``generate``: KV cache, prefill and
decode, the cache by layer) and ``report_cpu_gpt_step.json`` (a tiny GPT-2's training step:
the peak by module). The kernel is IPython's, with the extension loaded as a user loads it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from IPython.testing.globalipapp import start_ipython

SETUP = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
config = GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=2048, n_positions=256)
model = GPT2LMHeadModel(config)
"""
STEP = """%%gpumem -o report --name training-step
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = torch.randint(0, 2048, (8, 128))
for _ in range(2):
    loss = model(batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
GENERATE = """%%gpumem -o report --name generate
small = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=128)).eval()
prompt = torch.randint(0, 256, (2, 8))
with torch.no_grad():
    out = small.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0)
"""


def main(folder: str) -> None:
    ip = start_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    ip.run_cell(SETUP)
    for cell, name in ((GENERATE, "report_gpu_generate.json"), (STEP, "report_cpu_gpt_step.json")):
        result = ip.run_cell(cell)
        result.raise_error()
        report = ip.user_ns["report"]
        Path(folder, name).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        print(report)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
