"""Shared pieces of the benchmarks: model variants, the analytic FLOP count, the machine description, the
measurement workers that run in fresh processes (one per measured point, so that peak memory is its own), and the
interleaved rounds and results files of the translation benchmarks (`bench_translate`, `bench_real_text`).

Peak memory method: every measured point runs in a fresh process forked from a `forkserver` that has only
imported torch/transformers/modeling_ode (no tensors, no threads started). Two figures per training variant:
- live-tensor peak (the memory targets; the CPU analogue of torch.cuda.max_memory_allocated): the bytes that stay
  allocated between steps (weights, buffers, Adam state) plus the highest running sum of the allocations and frees
  torch.profiler records during one more training step;
- process RSS peak: VmHWM (the kernel's resident-set high-water mark, reset at fork) after the last step minus
  VmRSS before the model is built. It adds what the C allocator keeps: fragmentation and slack, thread pools and
  library buffers, which depend on the order of allocations more than on the model.
tracemalloc cannot see torch's allocations, and the CPU has no allocator statistics of its own.
On a CUDA device the two figures are the caching allocator's own: torch.cuda.max_memory_allocated (live tensors)
and torch.cuda.max_memory_reserved (what the allocator holds), both reset when the worker starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ode_transformer.precision import cpu_capability, device_native_bf16

# ----------------------------------------------------------------------------------------------------------
# Dimensions and variants
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dims:
    d_model: int
    ffn_dim: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    vocab_size: int
    dropout: float = 0.1

    def as_dict(self) -> dict:
        return dict(self.__dict__)


BASE_DIMS = Dims(d_model=512, ffn_dim=2048, heads=8, encoder_layers=6, decoder_layers=6, vocab_size=8000)
TINY_DIMS = Dims(d_model=32, ffn_dim=64, heads=2, encoder_layers=2, decoder_layers=2, vocab_size=128)

# Plain Transformer features, to match Marian: residual stacking, no relative positions.
PLAIN = {
    "encoder_layer_connections": "residual",
    "decoder_layer_connections": "residual",
    "max_relative_position": 0,
}
# The paper's defaults: Shaw relative positions (k = 8) and learnable dense (DLCL) layer connections.
PAPER = {
    "encoder_layer_connections": "learnable_dense",
    "decoder_layer_connections": "learnable_dense",
    "max_relative_position": 8,
}

PC_CORRECTOR = {"encoder_layer_connections": "predictor_corrector", "ode_coefficient_scope": "stack"}

# name -> (encoder_ode_method, encoder_ode_coefficients, features, extra config fields); None = Marian.
VARIANTS: dict[str, tuple | None] = {
    "marian": None,
    "residual": ("euler", "tableau", PLAIN, {}),
    "rk2": ("rk2", "tableau", PLAIN, {}),
    "rk2_gated": ("rk2", "gated", PLAIN, {}),
    "rk4": ("rk4", "tableau", PLAIN, {}),
    "rk2_ckpt": ("rk2", "tableau", PLAIN, {"ode_checkpoint_stages": True}),
    "residual_paper": ("euler", "tableau", PAPER, {}),
    "rk2_gated_paper": ("rk2", "gated", PAPER, {}),
    # PCformer: an EMA predictor (one alpha for the stack) and the corrector, whose learned history of
    # layer-normalised states replaces plain stacking; s + 1 evaluations of F per block.
    "pc_rk2": ("rk2", "ema", PLAIN, PC_CORRECTOR),
    "pc_rk4": ("rk4", "ema", PLAIN, PC_CORRECTOR),
}
INFERENCE_VARIANTS = [name for name in VARIANTS if name != "rk2_ckpt"]  # same as rk2 at inference
STAGES = {"euler": 1, "rk2": 2, "rk4": 4}


def ode_config(dims: Dims, method: str, coefficients: str, features: dict, extra: dict | None = None, **kw):
    from modeling_ode import ODETransformerConfig

    return ODETransformerConfig(
        vocab_size=dims.vocab_size,
        d_model=dims.d_model,
        encoder_ffn_dim=dims.ffn_dim,
        decoder_ffn_dim=dims.ffn_dim,
        encoder_attention_heads=dims.heads,
        decoder_attention_heads=dims.heads,
        encoder_layers=dims.encoder_layers,
        decoder_layers=dims.decoder_layers,
        dropout=dims.dropout,
        attention_dropout=dims.dropout,
        activation_dropout=dims.dropout,
        max_position_embeddings=1024,
        encoder_ode_method=method,
        encoder_ode_coefficients=coefficients,
        decoder_ode_method="euler",
        decoder_ode_coefficients="tableau",
        **{**features, **(extra or {})},  # extra fields may replace a feature (the corrector's connections)
        **kw,
    )


def build_model(name: str, dims: Dims) -> torch.nn.Module:
    """The seq2seq model of a variant: ours, or transformers.MarianMTModel with the same dimensions."""
    if VARIANTS[name] is None:
        from transformers import MarianConfig, MarianMTModel

        config = MarianConfig(
            vocab_size=dims.vocab_size,
            d_model=dims.d_model,
            encoder_layers=dims.encoder_layers,
            decoder_layers=dims.decoder_layers,
            encoder_attention_heads=dims.heads,
            decoder_attention_heads=dims.heads,
            encoder_ffn_dim=dims.ffn_dim,
            decoder_ffn_dim=dims.ffn_dim,
            activation_function="relu",  # Marian's default is swish; ours is relu
            dropout=dims.dropout,
            attention_dropout=dims.dropout,
            activation_dropout=dims.dropout,
            max_position_embeddings=1024,
            scale_embedding=True,
            pad_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
        )
        return MarianMTModel(config)
    from modeling_ode import ODETransformerForConditionalGeneration

    method, coefficients, features, extra = VARIANTS[name]
    return ODETransformerForConditionalGeneration(ode_config(dims, method, coefficients, features, extra))


def make_batch(
    batch: int, src_len: int, tgt_len: int, vocab: int, seed: int = 0, device: str = "cpu"
) -> dict:
    """Random tokens; source lengths uniform in [src_len / 2, src_len] (right padding), full-length targets.
    The same tokens on every device (drawn on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (batch, src_len), generator=g)
    lengths = torch.randint(max(1, src_len // 2), src_len + 1, (batch,), generator=g)
    lengths[0] = src_len
    attention_mask = (torch.arange(src_len)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 1)
    labels = torch.randint(3, vocab, (batch, tgt_len), generator=g)
    return {
        key: t.to(device)
        for key, t in (("input_ids", input_ids), ("attention_mask", attention_mask), ("labels", labels))
    }


# ----------------------------------------------------------------------------------------------------------
# Analytic FLOP count
# ----------------------------------------------------------------------------------------------------------

FLOP_FORMULA = """\
Matmul FLOPs only (2 per multiply-add); B sentences, S source and T target tokens each, d model width,
f FFN width, V vocabulary, s encoder evaluations of F per block (stages; PCformer: stages + 1), k relative-position clip (0 = none), L_e / L_d layers:
  encoder, per layer and stage : 2BS(4d^2 + 2df) + 4BS^2 d            [+ 2BSd(2k+1) with RPR]
  gate (gated coefficients)    : 2BS(s d)(s-1) per layer
  decoder, per layer           : 2BT(6d^2 + 2df) + 4BSd^2 + 4BT^2 d + 4BTSd   [+ 2BTd(2k+1) with RPR]
  output projection            : 2BTdV
  forward F = L_e s (encoder) + L_e gate + L_d (decoder) + head
  training step = 3F (backward = 2x forward) + recomputed forward of stages 2..s with ode_checkpoint_stages
Attention is counted dense (the causal mask does not save work in either implementation)."""


def forward_flops(dims: Dims, batch: int, src: int, tgt: int, stages: int, gated: bool, rpr: int) -> dict:
    d, f, V = dims.d_model, dims.ffn_dim, dims.vocab_size
    B, S, T = batch, src, tgt
    enc_stage = (
        2 * B * S * (4 * d * d + 2 * d * f)
        + 4 * B * S * S * d
        + (2 * B * S * d * (2 * rpr + 1) if rpr else 0)
    )
    gate = 2 * B * S * stages * d * (stages - 1) if gated else 0
    dec = (
        2 * B * T * (6 * d * d + 2 * d * f)
        + 4 * B * S * d * d
        + 4 * B * T * T * d
        + 4 * B * T * S * d
        + (2 * B * T * d * (2 * rpr + 1) if rpr else 0)
    )
    head = 2 * B * T * d * V
    return {
        "encoder_stage": dims.encoder_layers * enc_stage,
        "encoder": dims.encoder_layers * (stages * enc_stage + gate),
        "decoder": dims.decoder_layers * dec,
        "head": head,
    }


def encoder_evaluations(name: str) -> tuple[int, bool, int]:
    """A variant's evaluations of F per encoder block (stages; PCformer's corrector adds one: its history weights
    are not matmuls), whether its coefficients are gated, and its relative-position clip (0 = none)."""
    spec = VARIANTS[name]
    method, coefficients, features, extra = spec if spec is not None else ("euler", "tableau", PLAIN, {})
    config = {**features, **extra}
    s = STAGES[method] + (config["encoder_layer_connections"] == "predictor_corrector")
    return s, coefficients == "gated", config["max_relative_position"]


def train_flops(name: str, dims: Dims, batch: int, src: int, tgt: int) -> dict:
    extra = (VARIANTS[name] or (None, None, None, {}))[3]
    s, gated, rpr = encoder_evaluations(name)
    parts = forward_flops(dims, batch, src, tgt, s, gated, rpr)
    forward = parts["encoder"] + parts["decoder"] + parts["head"]
    recompute = (s - 1) * parts["encoder_stage"] if extra.get("ode_checkpoint_stages") else 0
    return {
        "forward": forward,
        "train_step": 3 * forward + recompute,
        "encoder_share": parts["encoder"] / forward,
    }


GENERATE_FLOP_FORMULA = """\
Decoding B sentences of S source tokens into T new tokens each with K beams (K = 1: greedy), cached: the
encoder runs once on the B sentences (as in training: L_e s evaluations of F, plus the gate); the decoder (Euler in
every benchmark variant: one evaluation per layer) runs T steps on R = BK rows, one token per row and step:
  decoder, per layer           : 2RT(6d^2 + 2df) + 4RSd^2 + 2RT(T+1)d + 4RTSd   [+ 2RTd(2k+1) with RPR]
  (projections and FFN per token; cross-attention keys/values once; step t attends over t cached positions)
  output projection            : 2RTdV
predicted speed of a variant over residual = residual FLOPs / the variant's FLOPs (beam bookkeeping, cache
copies and Python are not matmuls: what they cost shows as measured / predicted below 1)."""


def decode_flops(dims: Dims, rows: int, src: int, new_tokens: int, rpr: int = 0) -> dict:
    """Matmul FLOPs of `new_tokens` cached decoder steps on `rows` rows (sentences x beams) against `src` encoder
    positions (GENERATE_FLOP_FORMULA): the decoder layers and the output projection."""
    d, f, V = dims.d_model, dims.ffn_dim, dims.vocab_size
    R, S, T = rows, src, new_tokens
    layer = (
        2 * R * T * (6 * d * d + 2 * d * f)
        + 4 * R * S * d * d
        + 2 * R * T * (T + 1) * d
        + 4 * R * T * S * d
        + (2 * R * T * d * (2 * rpr + 1) if rpr else 0)
    )
    return {"decoder": dims.decoder_layers * layer, "head": 2 * R * T * d * V}


def generate_flops(name: str, dims: Dims, batch: int, beams: int, src: int, new_tokens: int) -> dict:
    """Matmul FLOPs of one `generate` call of a variant: `batch` sentences padded to `src` tokens, `beams` beams,
    exactly `new_tokens` new tokens (GENERATE_FLOP_FORMULA). The decoder is the benchmark variants' Euler one."""
    s, gated, rpr = encoder_evaluations(name)
    encoder = forward_flops(dims, batch, src, 1, s, gated, rpr)["encoder"]
    decoder = decode_flops(dims, batch * beams, src, new_tokens, rpr)
    return {
        "encoder": encoder,
        "decoder": decoder["decoder"] + decoder["head"],
        "total": encoder + decoder["decoder"] + decoder["head"],
    }


# ----------------------------------------------------------------------------------------------------------
# Machine and hardware limit
# ----------------------------------------------------------------------------------------------------------


def machine_info(device: str = "cpu") -> dict:
    cpu, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name") and cpu == "unknown":
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    import transformers

    return {
        "cpu_model": cpu,
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "isa": sorted(f for f in flags if f.startswith(("avx512_bf16", "amx", "avx512f", "avx2"))),
        # the kernels PyTorch runs (honours ATEN_CPU_CAPABILITY), and whether bf16 is native or emulated here
        "cpu_capability": cpu_capability(),
        "native_bf16": dict(zip(("native", "reason"), device_native_bf16(device))),
        "cpu_features": cpu_features(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()),
        "device": device,
        "accelerator": torch.cuda.get_device_name(device) if is_cuda(device) else None,
    }


# torch.cpu.get_capabilities() flags behind the int8 and bf16 kernels: VNNI (int8 dot products, AVX-512 or AVX
# encoded), AMX tiles and AVX512_BF16.
CPU_FEATURES = (
    "avx2",
    "avx512_f",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "avx512_bf16",
)


def cpu_features() -> dict[str, bool]:
    """Which of CPU_FEATURES this CPU has, as PyTorch's cpuinfo reads them (all False where torch cannot say)."""
    reader = getattr(torch.cpu, "get_capabilities", None)
    capabilities = dict(reader()) if reader is not None else {}
    return {flag: bool(capabilities.get(flag)) for flag in CPU_FEATURES}


def describe_cpu(machine: dict) -> str:
    """One line for a report: PyTorch's kernel level and the CPU's int8 / bf16 features (machine_info's)."""
    features = machine.get("cpu_features", {})
    has = [flag.upper() for flag in CPU_FEATURES[2:] if features.get(flag)]
    lacks = [flag.upper() for flag in CPU_FEATURES[2:] if not features.get(flag)]
    return f"PyTorch kernels {machine['cpu_capability']}; has {', '.join(has) or 'none'}" + (
        f"; lacks {', '.join(lacks)}" if lacks else ""
    )


def cpu_ticks() -> dict:
    """Machine-wide CPU time from /proc/stat (clock ticks): total, and `steal`, the time a virtual machine's
    host gave to others. A run with steal (or a busy machine) has disturbed timings."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
    except OSError:
        return {"total": 0, "steal": 0}
    return {"total": sum(values[:8]), "steal": values[7] if len(values) > 7 else 0}


def matmul_gflops(n: int, dtype: torch.dtype, reps: int = 5, device: str = "cpu") -> float:
    """Best-of-`reps` throughput of an n x n @ n x n torch.matmul (2 n^3 FLOPs) on `device`."""
    a, b = torch.randn(n, n).to(device, dtype), torch.randn(n, n).to(device, dtype)
    torch.matmul(a, b)
    best = min(timed(lambda: torch.matmul(a, b), device) for _ in range(reps))
    return 2 * n**3 / best / 1e9


# ----------------------------------------------------------------------------------------------------------
# Process set-up: threads and the C allocator
# ----------------------------------------------------------------------------------------------------------

MALLOC_POLICIES = ("keep-freed", "default")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt options, from glibc's malloc.h


def configure_process(threads: int, malloc: str) -> None:
    """Torch threads and the glibc malloc policy of this process (the main one and every worker alike).

    `keep-freed` raises glibc's mmap and trim thresholds far above one step's allocations, so freed tensor memory
    stays in the process and is reused, as PyTorch's CUDA caching allocator does by design. With glibc's defaults
    (`default`) the heap is trimmed and refilled every step once activations are large, which costs the RK4
    training step page faults the residual and RK2 models do not take (the measurements: benchmarks/README.md,
    "glibc malloc policy"). Users get the same with MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set to
    `1 << 30` in the environment.
    """
    if malloc not in MALLOC_POLICIES:
        raise ValueError(f"malloc policy {malloc!r} is not one of {MALLOC_POLICIES}")
    torch.set_num_threads(threads)
    if malloc == "default":
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not all(
        mallopt(option, 1 << 30) for option in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD)
    ):
        raise RuntimeError("this C library has no glibc mallopt; run the benchmark with --malloc default")


# ----------------------------------------------------------------------------------------------------------
# Workers (each call runs in a fresh forked process)
# ----------------------------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def process_peak_name(device: str) -> str:
    """What `peak_mem_mb` is on the device: the process's resident-set peak, or the CUDA allocator's reserved
    peak (the live-tensor peak, `tensor_peak_mb`, is measured on both)."""
    return "reserved" if is_cuda(device) else "RSS"


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after it times the work (CUDA runs async)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def timed(function, device: str | torch.device) -> float:
    """Wall seconds of `function()`, with the device's queued work drained before the clock starts and stops."""
    synchronize(device)
    start = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - start


def process_peak_mb(device: str, start_kb: int) -> float:
    """The worker's process peak (see :func:`process_peak_name`): VmHWM above `start_kb` (VmRSS before the
    model), or the CUDA allocator's reserved peak since the worker started."""
    if is_cuda(device):
        return torch.cuda.max_memory_reserved(device) / 2**20
    return (_status_kb("VmHWM") - start_kb) / 1024


def _autocast(dtype: str, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict, dtype: str) -> float:
    """One forward + backward + Adam step on the batch's device; returns its wall time in seconds."""
    device = batch["input_ids"].device

    def step() -> None:
        with _autocast(dtype, device):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, device)


def train_worker(spec: dict) -> dict:
    """Training steps (forward + backward + Adam step) of one variant: step times and peak memory."""
    configure_process(spec["threads"], spec["malloc"])
    device = spec["device"]
    start_kb = _status_kb("VmRSS")
    torch.manual_seed(0)
    dims = Dims(**spec["dims"])
    model = build_model(spec["model"], dims).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = make_batch(spec["batch"], spec["src_len"], spec["tgt_len"], dims.vocab_size, device=device)
    times = []
    for step in range(spec["warmup"] + spec["reps"]):
        elapsed = train_step(model, optimizer, batch, spec["dtype"])
        if step >= spec["warmup"]:
            times.append(elapsed)
    peak_mem_mb = process_peak_mb(device, start_kb)  # read before the profiled step below adds its own
    if is_cuda(device):  # the allocator counts from the process start, with the model and Adam state
        tensor_peak = torch.cuda.max_memory_allocated(device)
    else:
        tensor_peak = tensor_peak_bytes(model, optimizer, batch, spec["dtype"])
    return {
        "step_s_all": times,
        "peak_mem_mb": peak_mem_mb,
        "tensor_peak_mb": tensor_peak / 2**20,
        "params": sum(p.numel() for p in model.parameters()),
    }


def tensor_peak_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict, dtype: str
) -> int:
    """Peak bytes of live tensors in one more training step: what stays allocated between steps (weights, buffers,
    Adam state) plus the highest sum of the allocations and frees the profiler records during the step. Unlike
    the RSS peak it leaves out the C allocator's fragmentation and slack."""
    from torch.profiler import ProfilerActivity, profile

    kept = [*model.state_dict().values(), *(t for state in optimizer.state.values() for t in state.values())]
    # Keyed by storage, so tied weights count once.
    resident = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(model, optimizer, batch, dtype)
    # The raw allocator events (`nbytes` < 0 for a free) behind torch.profiler's memory timeline.
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return sum(resident.values()) + peak


def encoder_worker(spec: dict) -> dict:
    """Scaling point: one encoder alone, forward + backward of mean(h^2) (no optimizer)."""
    from modeling_ode.modeling_ode_transformer import ODETransformerEncoder

    configure_process(spec["threads"], spec["malloc"])
    device = spec["device"]
    start_kb = _status_kb("VmRSS")
    torch.manual_seed(0)
    dims = Dims(**{**spec["dims"], "encoder_layers": spec["layers"]})
    config = ode_config(dims, spec["method"], "tableau", PLAIN)
    encoder = ODETransformerEncoder(config).to(device)
    encoder.train()
    batch = make_batch(spec["batch"], spec["length"], 1, dims.vocab_size, device=device)

    def step() -> None:
        hidden = encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        hidden.float().square().mean().backward()
        encoder.zero_grad(set_to_none=True)

    times = [timed(step, device) for _ in range(spec["warmup"] + spec["reps"])][spec["warmup"] :]
    return {"step_s_all": times, "peak_mem_mb": process_peak_mb(device, start_kb)}


# ----------------------------------------------------------------------------------------------------------
# Interleaved rounds: the timing and the results files of the translation benchmarks
# ----------------------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _always(system: str, setting: str) -> bool:
    return True


def run_rounds(
    systems: Mapping[str, Callable],
    settings: Mapping[str, tuple[int, int]],
    rounds: int,
    calls_for: Callable[[str], list[tuple]],
    runs_in: Callable[[str, str], bool] = _always,
    on_warm_up: Callable[[str, str, object, tuple], None] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Seconds per call set, {setting: {system: [one per round]}}, every system in turn in each round (`rotated`).

    `settings`: name -> (batch size, beams); `calls_for(setting)`: the argument tuples of a setting's calls, each
    passed with the setting's beams to a system; `runs_in(system, setting)`: whether a system runs in a setting.
    The first call of each system (compiling, warming the allocator) is not timed: `on_warm_up(setting, system,
    its output, the call)` sees it.
    """
    times = {setting: {name: [] for name in systems if runs_in(name, setting)} for setting in settings}
    for setting, (_, beams) in settings.items():
        first = calls_for(setting)[0]
        for name in times[setting]:
            begin = time.perf_counter()
            output = systems[name](*first, beams)
            if on_warm_up is not None:
                on_warm_up(setting, name, output, first)
            log(f"warm-up {setting} {name}: {time.perf_counter() - begin:.1f} s")
    for round_index in range(rounds):
        for setting, (_, beams) in settings.items():
            calls = calls_for(setting)
            for name in rotated(list(systems), round_index):
                if name not in times[setting]:
                    continue
                begin = time.perf_counter()
                for call in calls:
                    systems[name](*call, beams)
                times[setting][name].append(time.perf_counter() - begin)
        log(f"round {round_index + 1} done")
    return times


def rotated(names: list[str], round_index: int) -> list[str]:
    """The systems' order in round `round_index`: each round starts one system later, so that no system is always
    timed first (after another setting's systems) or always after the same neighbour."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def spread(seconds: list[float], sentences: int) -> dict[str, float]:
    """A system's sentences/s over the rounds: best (min time), median and worst, and the relative spread
    worst-to-best time, (max - min) / min."""
    return {
        "max": sentences / min(seconds),
        "median": sentences / statistics.median(seconds),
        "min": sentences / max(seconds),
        "relative": max(seconds) / min(seconds) - 1,
    }


def spreads(seconds_all: dict, sentences: Mapping[str, int]) -> dict:
    """`spread` of every system in every setting."""
    return {
        setting: {name: spread(times, sentences[setting]) for name, times in per_system.items()}
        for setting, per_system in seconds_all.items()
    }


def write_results(results: dict, out_dir: Path, stem: str, report: str) -> None:
    """<stem>-<time stamp>.json, and <stem>.json / <stem>.md (the newest); the report printed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1) + "\n"
    (out_dir / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    (out_dir / f"{stem}.json").write_text(text)
    (out_dir / f"{stem}.md").write_text(report)
    print(report)
