"""Per-step overhead of greedy and beam decoding, the residual ODE model against MarianMT (base dims, batch 16 x 32
source tokens, 32 new tokens): time per step, the host-device synchronisations of one greedy `generate` and where
they come from (CUDA only: `torch.cuda.set_sync_debug_mode`), and the kernels and aten ops it launches.

    python -m benchmarks.decode_overhead --device cuda

On a GPU at this size decoding waits on the host, which launches the kernels, so these counts decide its speed.
"""

from __future__ import annotations

import argparse
import collections
import traceback
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import common
from benchmarks.common import BASE_DIMS, TINY_DIMS

NEW_TOKENS = 32


def generate(model: torch.nn.Module, source: dict, beams: int) -> torch.Tensor:
    return model.generate(
        **source, num_beams=beams, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
    )


def sync_sites(model: torch.nn.Module, source: dict) -> collections.Counter:
    """Where one greedy generate synchronises with the GPU: the innermost three frames outside torch."""
    sites: collections.Counter = collections.Counter()

    show = warnings.showwarning

    def record(message, category, *args, **kwargs) -> None:
        # torch's sync debug warning is counted; any other warning is shown as usual
        if "synchroniz" not in str(message):
            show(message, category, *args, **kwargs)
            return
        frames = [f for f in traceback.extract_stack()[:-2] if "site-packages/torch" not in f.filename][-3:]
        sites[" <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in reversed(frames))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            generate(model, source, 1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny dims (what tests/test_benchmarks.py runs)")
    args = parser.parse_args(argv)
    device, dims = args.device, TINY_DIMS if args.quick else BASE_DIMS
    batch = common.make_batch(16, 32, 1, dims.vocab_size, seed=1, device=device)
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    models = {}
    for name in ("marian", "residual"):
        torch.manual_seed(0)
        models[name] = common.build_model(name, dims).to(device).eval()
    with torch.inference_mode():
        for model in models.values():  # warm-up
            generate(model, source, 1)
            generate(model, source, 4)
        for _ in range(args.reps):
            for name, model in models.items():
                for beams in (1, 4):
                    elapsed = common.timed(lambda m=model, b=beams: generate(m, source, b), device)
                    print(f"{name} beams {beams}: {1000 * elapsed / NEW_TOKENS:.2f} ms/step", flush=True)
        if common.is_cuda(device):
            for name, model in models.items():
                sites = sync_sites(model, source)
                print(f"== {name}: {sum(sites.values())} syncs in one greedy generate of {NEW_TOKENS} tokens")
                for site, count in sites.most_common(12):
                    print(f"  {count:4d}  {site}")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if common.is_cuda(device) else [])
        for name, model in models.items():
            with profile(activities=activities) as prof:
                generate(model, source, 1)
            events = prof.key_averages()
            kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            aten = sum(e.count for e in events if e.key.startswith("aten::"))
            print(f"== {name}: {kernels} CUDA kernels, {aten} aten ops in one greedy generate")
            print(events.table(sort_by="count", row_limit=18, max_name_column_width=50))


if __name__ == "__main__":
    main()
