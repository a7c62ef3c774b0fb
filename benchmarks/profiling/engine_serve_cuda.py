"""Where ``SimEngine.serve`` spends its time on a CUDA device: its rate on CPU and on CUDA
over the same 100 warm requests, then a torch profile (CPU and CUDA activity) of 100 more
on CUDA. Output: ``benchmarks/results/engine_serve_profile_h100.txt`` (docs/benchmarks.md).

Run (a CUDA machine): ``python benchmarks/profiling/engine_serve_cuda.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from engine import workload  # noqa: E402  (benchmarks/engine.py)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from offload_core.engine import EngineConfig, SimEngine  # noqa: E402

BLOCKS_PER_PROMPT = 64 * 2  # 1,024 tokens in 16-token blocks, two groups


def main() -> None:
    prompts = workload(300, 1024)
    for device in ("cpu", "cuda"):
        cfg = EngineConfig(
            groups="full:16,swa:16:256",
            gpu_blocks=BLOCKS_PER_PROMPT * 6,
            cpu_blocks=BLOCKS_PER_PROMPT * 12,
            device=device,
        )
        engine = SimEngine(cfg)
        for p in prompts[:100]:
            engine.serve(p)
        t0 = time.perf_counter()
        for p in prompts[100:200]:
            engine.serve(p)
        print(device, "req/s", 100 / (time.perf_counter() - t0), flush=True)
        if device == "cuda":
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for p in prompts[200:300]:
                    engine.serve(p)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
