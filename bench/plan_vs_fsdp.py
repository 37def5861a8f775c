"""The planner's FSDP memory per GPU against PyTorch's own FSDP memory tracker.

Peer: `torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker` on a real FSDP2 run
(`fully_shard` on every block, then the root) over a fake process group (collectives do
nothing; each rank's tensors are real), on CPU, world size N; the peak of the second step (the
first allocates the optimizer state). Ours: ``analyze --train --plan --strategy fsdp --gpus N``
on the same model, fp32, AdamW. Each case runs in its own process (a process group per world
size).

    .venv/bin/python bench/plan_vs_fsdp.py          # prints a Markdown table
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (  # (name, tiny_gpt.build keyword arguments)
    ("gpt 2×64, seq 16", {}),
    ("gpt 4×256, seq 128", {"n_layer": 4, "d_model": 256, "seq_len": 128, "vocab": 512}),
    ("gpt 8×512, seq 256", {"n_layer": 8, "n_head": 8, "d_model": 512, "seq_len": 256,
                            "vocab": 1024, "batch": 4}),
)
WORLD_SIZES = (2, 4, 8)

PEER = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from tests.models import tiny_gpt
n = {n}
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
mesh = init_device_mesh("cpu", (n,))
model, inputs = tiny_gpt.build(**{kwargs!r})
for block in model.blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tracker = FSDPMemTracker(model, optimizer)
tracker.track_inputs(inputs)
with tracker:
    for step in range(2):
        optimizer.zero_grad()
        model(*inputs).float().mean().backward()
        optimizer.step()
        if step == 0:
            tracker.reset_mod_stats()
peak = tracker.get_tracker_snapshot("peak")
print(json.dumps(next(v["Total"] for v in peak.values())))
"""

MODEL_FILE = """
from tests.models import tiny_gpt
def build():
    return tiny_gpt.build(**{kwargs!r})
"""


def peer_peak(kwargs: dict, n: int) -> int:
    code = PEER.format(root=str(ROOT), n=n, kwargs=kwargs)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return int(done.stdout.strip().splitlines()[-1])


def our_peak(kwargs: dict, n: int) -> int:
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model.py"
        model.write_text(MODEL_FILE.format(kwargs=kwargs))
        report = Path(folder) / "r.json"
        subprocess.run([sys.executable, "-m", "fxlens", str(model), "--plan", "--strategy",
                        "fsdp", "--gpus", str(n), "--precision", "fp32", "--no-pages",
                        "--quiet", "--json", str(report)], check=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        return json.loads(report.read_text())["plan"]["layouts"][0]["memory"]["peak_bytes"]


def main() -> None:
    print("| model | GPUs | FSDPMemTracker peak | fxlens plan peak | difference |")
    print("|---|---|---|---|---|")
    for name, kwargs in CASES:
        for n in WORLD_SIZES:
            peer, ours = peer_peak(kwargs, n), our_peak(kwargs, n)
            print(f"| {name} | {n} | {peer / 2**20:.2f} MiB | {ours / 2**20:.2f} MiB | "
                  f"{(ours - peer) / peer:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
