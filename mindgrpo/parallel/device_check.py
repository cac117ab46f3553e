"""A device's first contact: about a minute of checks of the parts a run leans on, on a small random model,
one process or every msrun rank (`scripts/check_device.py`).

    logprobs    the rollout engine's log-probs of its sampled tokens against the training graph's, in the
                run's compute dtype
    decode      the engine's graphs compiled for a few calls, against the count `graph_bound` promises
    collectives an all-reduce and an all-gather over every rank, against numpy (one process: nothing moves)
    reshard     the small model moved from tensor parallelism over every rank to data parallelism (one
                process: a copy), each rank's pieces bit for bit against the numpy plan (`reshard_plan`)
    swap        a parameter group offloaded and reloaded by the swap manager, device memory read before,
                between and after, the values unchanged (the CPU backend moves nothing and reads 0)

Each check returns a `Result`: pass or fail, and its figure. Under msrun every rank runs every check
(the collectives need them all) and a check fails when it fails on any rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindgrpo.inference.engine import RolloutEngine, graph_bound
from mindgrpo.inference.sampling import SamplingParams
from mindgrpo.memory.swap import SwapManager, nbytes
from mindgrpo.models.config import Qwen2Config
from mindgrpo.models.convert import expected_shapes
from mindgrpo.models.qwen2 import Qwen2ForCausalLM
from mindgrpo.models.scoring import TokenLogProbs
from mindgrpo.parallel.comm import AllGather, AllReduce, Comm, init_comm
from mindgrpo.parallel.layout import ParallelLayout, num_layers_of
from mindgrpo.parallel.reshard import Reshard, named_parameters
from mindgrpo.parallel.reshard_plan import apply_plans, plan_parameter
from mindgrpo.parallel.tp_layers import TensorParallelLayers

# the engine's log-probs against the training graph's, by compute dtype: fp32 rounding of two summation
# orders (the engine's fused weights and KV cache); half precision rounds each matmul's output to 8 or 11 bits
LOGPROB_TOLERANCE = {"float32": 1e-4, "float16": 5e-2, "bfloat16": 2e-1}
PROMPTS = [[3, 4, 5], [7], [9, 10, 11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
MAX_TOKENS, TEMPERATURE, SLOTS, MAX_MODEL_LEN = 12, 0.7, 4, 64


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    figure: str


@dataclass
class Context:
    """What the checks share: the world, the small model (whole, this rank's copy) and its engine."""

    comm: Comm
    cfg: Qwen2Config
    lm: Qwen2ForCausalLM
    engine: RolloutEngine


def small_config(compute_dtype: str, world: int) -> Qwen2Config:
    """A random Qwen2 small enough to compile in seconds; its heads split over `world` ranks."""
    heads = 4 * world
    return Qwen2Config(vocab_size=96, hidden_size=8 * heads, intermediate_size=16 * heads, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=128,
                       tie_word_embeddings=False, param_init_std=0.3, compute_dtype=compute_dtype)


def world_comm(world: int) -> Comm:
    """One process: a world of one (no communication). Under msrun: init, with the groups the reshard check
    uses (tensor parallelism over every rank -> data parallelism over every rank)."""
    tp, dp = ParallelLayout(tp=world), ParallelLayout(dp=world)
    if world == 1:
        return Comm(0, 1, ms.get_context("device_target"), tp, dp)
    return init_comm(train=tp, infer=dp)


CHECKS: Dict[str, Callable[[Context], Result]] = {}


def check(name: str):
    def register(fn):
        CHECKS[name] = fn
        return fn
    return register


def scored(prompts, completions):
    """The training graph's inputs for the completions: ids (B, S) right-padded, score positions and labels
    (B, R) (the position whose logits predict each response token), the engine's log-probs (B, R), mask (B, R)."""
    seqs = [list(prompts[c.prompt_index]) + list(c.token_ids) for c in completions]
    width, rows = MAX_MODEL_LEN, len(completions)
    ids = np.zeros((rows, width), np.int32)
    pos, labels = np.zeros((rows, MAX_TOKENS), np.int32), np.zeros((rows, MAX_TOKENS), np.int32)
    engine_logp, mask = np.zeros((rows, MAX_TOKENS), np.float32), np.zeros((rows, MAX_TOKENS), np.float32)
    for i, (c, seq) in enumerate(zip(completions, seqs)):
        n, start = len(c.token_ids), len(prompts[c.prompt_index]) - 1
        ids[i, :len(seq)] = seq
        pos[i, :n], labels[i, :n] = np.arange(start, start + n), c.token_ids
        engine_logp[i, :n], mask[i, :n] = c.logprobs, 1
    return ids, pos, labels, engine_logp, mask


@check("logprobs")
def logprobs(ctx: Context) -> Result:
    out = ctx.engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, n=2, seed=2))
    ids, pos, labels, engine_logp, mask = scored(PROMPTS, out)
    logp, _ = TokenLogProbs(ctx.lm, with_entropy=False, temperature=TEMPERATURE)(
        Tensor(ids), Tensor(pos), Tensor(labels))
    diff = float(np.abs((logp.asnumpy() - engine_logp) * mask).max())
    tol = LOGPROB_TOLERANCE[ctx.cfg.compute_dtype]
    return Result("logprobs", diff <= tol, f"max |engine - training| {diff:.2e} over {int(mask.sum())} tokens "
                                           f"({ctx.cfg.compute_dtype}, tolerance {tol:.0e})")


@check("decode")
def decode_graphs(ctx: Context) -> Result:
    """Calls of several batch and prompt sizes after the log-probs check's: the engine's graphs, all of them
    compiled in this process, at most the bound for its slots and capacity."""
    t0 = time.perf_counter()
    for n, prompts in ((1, PROMPTS[:1]), (3, PROMPTS), (1, [list(range(1, 40))])):
        ctx.engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, n=n, seed=n))
    seconds = time.perf_counter() - t0
    b = graph_bound(SLOTS, MAX_MODEL_LEN, MAX_MODEL_LEN - MAX_TOKENS)
    bound = b["decode"] + b["prompt_buckets"] * (b["prefill_per_prompt_bucket"] + b["copy_per_prompt_bucket"])
    count = ctx.engine.compiled_graphs
    return Result("decode", 0 < count <= bound, f"{count} graphs compiled (graph_bound promises at most {bound}), "
                                                f"the calls {seconds:.1f} s")


@check("collectives")
def collectives(ctx: Context) -> Result:
    comm = ctx.comm
    if comm.world == 1:
        return Result("collectives", True, "one process: nothing to exchange (run under msrun to check them)")
    world = comm.group(range(comm.world))
    x = (np.arange(1 << 16, dtype=np.float32) % 251) * (comm.rank + 1)  # 256 KB a rank
    t0 = time.perf_counter()
    summed = AllReduce(world)(Tensor(x)).asnumpy()
    gathered = AllGather(world)(Tensor(x.reshape(1, -1))).asnumpy()
    seconds = time.perf_counter() - t0
    base = np.arange(1 << 16, dtype=np.float32) % 251
    ok = (np.array_equal(summed, base * sum(range(1, comm.world + 1)))
          and np.array_equal(gathered, np.stack([base * (r + 1) for r in range(comm.world)])))
    return Result("collectives", ok, f"all-reduce and all-gather of 256 KB over {comm.world} ranks "
                                     f"{'exact' if ok else 'WRONG'}, {seconds:.2f} s with their compiles")


def gather_pieces(comm: Comm, pieces: List[np.ndarray]) -> Dict[int, List[np.ndarray]]:
    """Every rank's pieces (the same shapes on every rank), bit for bit: summed over the world where every other
    rank's slot holds -0.0 (x + -0.0 is x)."""
    flat = np.concatenate([p.reshape(-1) for p in pieces]).astype(np.float32)
    table = np.full((comm.world, flat.size), -0.0, np.float32)
    table[comm.rank] = flat
    if comm.world > 1:
        table = comm.host_sum(table, comm.group(range(comm.world)))
    out = {}
    for r in range(comm.world):
        row, at = [], 0
        for p in pieces:
            row.append(table[r, at:at + p.size].reshape(p.shape))
            at += p.size
        out[r] = row
    return out


@check("reshard")
def reshard(ctx: Context) -> Result:
    comm, cfg = ctx.comm, ctx.cfg
    src_layout, dst_layout = comm.train, comm.infer
    src = Qwen2ForCausalLM(cfg, seed=7, max_positions=64, layers=TensorParallelLayers(comm.tp_group(src_layout)))
    dst = Qwen2ForCausalLM(cfg, seed=8, max_positions=64, layers=TensorParallelLayers(comm.tp_group(dst_layout)))
    shapes = expected_shapes(cfg)
    sync = Reshard(src, dst, src_layout, dst_layout, comm, shapes)
    metrics = sync()
    names = sorted(named_parameters(src))
    held = named_parameters(src)
    pieces = gather_pieces(comm, [held[n].asnumpy() for n in names])
    layers = num_layers_of(list(shapes))
    plans = {r: [plan_parameter(n, shapes[n], 4, src_layout, dst_layout, r, layers) for n in names]
             for r in range(comm.world)}
    expected = apply_plans(plans, pieces, [shapes[n] for n in names])[comm.rank]
    got = named_parameters(dst)
    wrong = [n for n, e in zip(names, expected)
             if e is not None and not np.array_equal(got[n].asnumpy().view(np.uint32), e.view(np.uint32))]
    figure = (f"{src_layout} -> {dst_layout}: {len(names)} parameters, "
              f"{metrics['sync/bytes'] / 1e6:.2f} MB, {metrics['sync/seconds']:.2f} s")
    if wrong:
        return Result("reshard", False, f"{figure}; not the numpy plan's bits: {', '.join(wrong[:3])}"
                                        + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""))
    return Result("reshard", True, f"{figure}; bit for bit as the numpy plan")


def device_bytes() -> Optional[int]:
    try:
        return int(ms.runtime.memory_allocated())
    except (AttributeError, RuntimeError):
        return None


@check("swap")
def swap(ctx: Context) -> Result:
    """The policy group offloaded (a phase without it) and reloaded (its own phase) by the run's swap manager:
    the ledger, the device memory (where the backend reports it) and the values."""
    device = ms.get_context("device_target")
    memory = SwapManager(enabled=True, device=device)
    params = list(ctx.lm.get_parameters())
    values = [p.asnumpy().copy() for p in params]
    memory.register("policy", params)
    ledger, read = [], []
    for phase in ("update", "rollout", "update"):
        with memory.phase(phase):
            ledger.append(memory.resident_bytes())
            read.append(device_bytes())
    same = all(np.array_equal(a, p.asnumpy()) for a, p in zip(values, params))
    size = nbytes(params)
    ok = same and ledger == [size, 0, size]
    figure = (f"{size / 1e6:.2f} MB offloaded and reloaded: ledger {ledger[0]} -> {ledger[1]} -> {ledger[2]} bytes, "
              f"device memory {read[0]} -> {read[1]} -> {read[2]} bytes, values {'unchanged' if same else 'CHANGED'}")
    if device == "CPU":
        return Result("swap", ok, figure + " (CPU: nothing moves and device memory reads 0; the ledger is checked)")
    freed = None not in read and read[0] - read[1] >= size // 2 and read[2] >= read[0] - size // 2
    return Result("swap", ok and freed, figure)


def run_checks(comm: Comm, compute_dtype: str, names=None) -> List[Result]:
    """The named checks (default all, in CHECKS' order) on one small model; a check that raises fails
    with its error as its figure. Under msrun each result is failed when any rank failed it."""
    cfg = small_config(compute_dtype, comm.world)
    lm = Qwen2ForCausalLM(cfg, seed=1, max_positions=MAX_MODEL_LEN)
    ctx = Context(comm, cfg, lm, RolloutEngine(lm, max_num_seqs=SLOTS, max_model_len=MAX_MODEL_LEN))
    results = []
    for name in names or CHECKS:
        try:
            results.append(CHECKS[name](ctx))
        except Exception as e:  # noqa: BLE001 - a check that breaks is a failed check, named
            results.append(Result(name, False, f"{type(e).__name__}: {e}"))
    if comm.world > 1:
        flags = np.zeros(comm.world * len(results), np.float32)
        flags[comm.rank * len(results):(comm.rank + 1) * len(results)] = [not r.ok for r in results]
        failed = comm.host_sum(flags, comm.group(range(comm.world))).reshape(comm.world, len(results))
        results = [r if r.ok == (failed[:, i].sum() == 0) else
                   Result(r.name, False, f"{r.figure} (failed on rank(s) {list(np.flatnonzero(failed[:, i]))})")
                   for i, r in enumerate(results)]
    return results
