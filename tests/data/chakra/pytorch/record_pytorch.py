"""Record the ``mlp.<rank>.et`` fixture: one training step of a small MLP on two CPU
ranks (gloo), recorded by PyTorch and converted by Chakra's own tools.

Not run by CI (it needs PyTorch, mlc-chakra and et_replay; see README.md here for the
exact versions and commands). Each rank records its host execution trace with
``torch.profiler.ExecutionTraceObserver`` and its Kineto trace with ``torch.profiler``;
then, per rank, ``chakra_trace_link`` merges the two and ``chakra_converter PyTorch``
writes the Chakra ET file. Run from the repository root::

    python tests/data/chakra/pytorch/record_pytorch.py
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

OUT = pathlib.Path(__file__).resolve().parent  # writes mlp.<rank>.et here
WORLD = 2
BATCH, WIDTH = 8, 64  # small, so that the fixture stays a few kilobytes


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    for p in model.parameters():  # data parallel: average the gradients over the ranks
        assert p.grad is not None
        dist.all_reduce(p.grad)
        p.grad /= WORLD
    opt.step()


def _record(rank: int, tmp: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, WIDTH)
    _step(model, opt, x)  # warm-up, not recorded
    et = ExecutionTraceObserver().register_callback(f"{tmp}/host.{rank}.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=1, repeat=1),  # Chakra's linker looks for "ProfilerStep#"
        on_trace_ready=lambda p: p.export_chrome_trace(f"{tmp}/device.{rank}.json"),
        execution_trace_observer=et,
    ) as prof:
        for _ in range(2):
            _step(model, opt, x)
            prof.step()
    dist.destroy_process_group()


def _convert(rank: int, tmp: str) -> None:
    bin_dir = pathlib.Path(sys.executable).parent
    linked = f"{tmp}/linked.{rank}.json"
    subprocess.run(
        [
            str(bin_dir / "chakra_trace_link"),
            f"--rank={rank}",
            f"--chakra-host-trace={tmp}/host.{rank}.json",
            f"--chakra-device-trace={tmp}/device.{rank}.json",
            f"--output-file={linked}",
        ],
        check=True,
    )
    subprocess.run(
        [
            str(bin_dir / "chakra_converter"),
            f"--log-filename={tmp}/converter.log",
            "PyTorch",
            f"--input={linked}",
            f"--output={OUT}/mlp.{rank}.et",
        ],
        check=True,
    )


def main() -> None:
    tmp = tempfile.mkdtemp()
    try:
        mp.spawn(_record, args=(tmp,), nprocs=WORLD, join=True)
        for rank in range(WORLD):
            _convert(rank, tmp)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
