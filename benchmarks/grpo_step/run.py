"""The runs of the GRPO step benchmark: both sides alternating on each config, the scaling sweep, the
result files (the package docstring says what is measured and how)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Dict, List

import numpy as np

from benchmarks.grpo_step import __doc__ as DOC
from benchmarks.grpo_step.flops import update_flops
from benchmarks.grpo_step.ours import ours_worker
from benchmarks.grpo_step.report import PHASES, markdown, plot_compare, plot_scaling, scaling_sentence
from benchmarks.grpo_step.trl_side import trl_worker
from benchmarks.grpo_step.workload import BETA, LR, TEMPLATE, Workload
from benchmarks.harness import RESULTS, SHARED, code_version, load_average, run_stamp, write_results
from benchmarks.tiny_models import ALL_CONFIGS, CONFIGS
from benchmarks.workers import Workers

# the sweep's model sizes: (hidden, layers, heads, kv heads, intermediate), Qwen2 proportions
MODEL_SIZES = ((256, 4, 4, 2, 1024), (384, 6, 6, 2, 1536), (512, 8, 8, 2, 2048))
RESPONSE_LENGTHS, GROUP_SIZES = (64, 128, 256), (4, 8, 16)


# ----------------------------------------------------------------------------------- runs
def medians(steps: List[dict]) -> Dict[str, float]:
    return {k: float(np.median([s[k] for s in steps])) for k, v in steps[0].items() if isinstance(v, float)}


def compare(name: str, model: dict, folder: str, args) -> dict:
    """Both sides on one config, steps alternating; returns the config's JSON entry."""
    work = Workload(name, model, os.path.join(folder, name), args.prompts, args.shared)
    with Workers() as sides:  # when one side fails, the other is stopped
        ours = sides.start(ours_worker, work, os.path.join(folder, name, "ours"), args.group, args.new_tokens,
                           args.micro_batch, True)
        ours.recv()  # built before TRL starts, so neither side's set-up overlaps the other's steps
        trl = sides.start(trl_worker, work, os.path.join(folder, name, "trl"), args.group, args.new_tokens,
                          args.micro_batch, 1 + args.steps, not args.trl_no_gradient_checkpointing,
                          args.torch_threads)
        our_steps, trl_steps = [], []
        for _ in range(1 + args.steps):  # TRL step i, then ours, then TRL step i + 1 ...
            trl_steps.append(trl.recv())
            our_steps.append(ours.ask("step"))
            trl.send("go")
        our_rss, trl_rss = ours.ask("stop"), trl.recv()
    o, t = medians(our_steps[1:]), medians(trl_steps[1:])
    tokens = len(work.texts) * args.group * args.new_tokens
    flops = update_flops(model, [len(p) for p in work.prompt_ids for _ in range(args.group)], args.new_tokens)
    entry = {"params": work.params, "model": model, "prompts": work.data,
             "tokenizer": "Qwen2.5 (../shared/tokenizers/qwen2_5)" if work.tokenizer_dir == work.qwen_tokenizer
             else "mindgrpo tiny tokenizer (512 tokens)",
             "prompt_tokens": [len(p) for p in work.prompt_ids], "generated_tokens": tokens,
             "mindgrpo_step_s": o["step"], "trl_step_s": t["step"], "speedup": t["step"] / o["step"]}
    for phase in PHASES:
        entry[f"mindgrpo_{phase}_s"], entry[f"trl_{phase}_s"] = o[phase], t[phase]
    for side, m in (("mindgrpo", o), ("trl", t)):
        entry[f"{side}_tokens_per_s"] = tokens / m["step"]
        entry[f"{side}_generation_tokens_per_s"] = tokens / m["generation"]
    entry["update_gflop"] = flops / 1e9
    for side, steps, m, fw in (("mindgrpo", our_steps, o, "mindspore"), ("trl", trl_steps, t, "torch")):
        entry[f"{side}_update_gflops_per_s"] = flops / m["update"] / 1e9
        # each step against the peak measured right after it, then the median
        entry[f"{side}_update_pct_of_{fw}_peak"] = float(np.median(
            [100 * flops / s["update"] / 1e9 / s["matmul_gflops"]["peak"] for s in steps[1:]]))
        entry[f"{fw}_matmul_gflops"] = {k: float(np.median([s["matmul_gflops"][k] for s in steps[1:]]))
                                        for k in steps[0]["matmul_gflops"]}
    entry["mindgrpo_first_step_s"], entry["trl_first_step_s"] = our_steps[0]["step"], trl_steps[0]["step"]
    entry["mindgrpo_steps"], entry["trl_steps"] = our_steps, trl_steps
    entry["mindgrpo_peak_rss_gb"], entry["trl_peak_rss_gb"] = our_rss, trl_rss
    entry["trl_torch_threads"] = int(t["torch_threads"])
    print(f"{name}: mindgrpo {o['step']:.2f} s/step, TRL {t['step']:.2f} s/step, {entry['speedup']:.2f}x; "
          + ", ".join(f"{p} {o[p]:.2f}/{t[p]:.2f}" for p in PHASES), flush=True)
    return entry


def scaling(base: str, folder: str, args) -> dict:
    """Our step time against response length, group size and model size (mindgrpo only). The points
    are measured in --scaling_passes passes, every other one in reverse order, so a drift in the
    machine's load does not masquerade as a trend; medians over all passes' measured steps."""
    axes = [("response_length", r, args.group, MODEL_SIZES[0]) for r in RESPONSE_LENGTHS]
    axes += [("group_size", args.new_tokens, g, MODEL_SIZES[0]) for g in GROUP_SIZES]
    axes += [("model_size", args.new_tokens, args.group, size) for size in MODEL_SIZES]
    points = list(dict.fromkeys((r, g, size) for _, r, g, size in axes))  # the base point is on every axis
    works: Dict[tuple, Workload] = {}
    for size in MODEL_SIZES:
        h, layers, heads, kv, inter = size
        model = dict(ALL_CONFIGS[base], hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv, intermediate_size=inter)
        works[size] = Workload(base, model, os.path.join(folder, f"scaling_{h}x{layers}"), args.prompts, args.shared)
    runs: Dict[tuple, list] = {p: [] for p in points}
    for k in range(args.scaling_passes):
        for new_tokens, group, size in points if k % 2 == 0 else points[::-1]:
            micro = max(1, args.micro_batch * args.new_tokens // new_tokens)  # the same tokens per micro-batch
            with Workers() as sides:  # a fresh process per point: MindSpore keeps its memory pool
                ours = sides.start(ours_worker, works[size],
                                   os.path.join(folder, f"scaling_{k}_{new_tokens}_{group}_{size[0]}"), group,
                                   new_tokens, micro)
                ours.recv()
                steps = [ours.ask("step") for _ in range(1 + args.scaling_steps)]
                runs[new_tokens, group, size].append((micro, steps, ours.ask("stop"), os.getloadavg()[0]))
            print(f"scaling pass {k}: {new_tokens} tokens, G={group}, H={size[0]}: "
                  + ", ".join(f"{s['step']:.2f}" for s in steps[1:]) + " s/step", flush=True)
    out: Dict[str, list] = {"response_length": [], "group_size": [], "model_size": []}
    for axis, new_tokens, group, size in axes:
        work, rs = works[size], runs[new_tokens, group, size]
        m = medians([s for _, steps, _, _ in rs for s in steps[1:]])
        value = {"response_length": new_tokens, "group_size": group, "model_size": work.params}[axis]
        out[axis].append({"value": value, "new_tokens": new_tokens, "group_size": group, "params": work.params,
                          "body_params": work.params - work.model["vocab_size"] * size[0],  # without the embedding
                          "hidden_size": size[0], "layers": size[1], "micro_batch": rs[0][0],
                          "peak_rss_gb": max(r[2] for r in rs), "load_average_1min": float(np.mean([r[3] for r in rs])),
                          "step_s": m["step"], "first_step_s": [r[1][0]["step"] for r in rs],
                          "steps_s": [s["step"] for r in rs for s in r[1][1:]], **{f"{p}_s": m[p] for p in PHASES},
                          "tokens_per_s": len(work.texts) * group * new_tokens / m["step"]})
    out["base"], out["summary"] = base, scaling_sentence(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=DOC.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(ALL_CONFIGS))
    ap.add_argument("--mode", choices=("compare", "scaling", "all"), default="compare")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per side after one warm-up step")
    ap.add_argument("--scaling_steps", type=int, default=2, help="measured steps per sweep point and pass")
    ap.add_argument("--scaling_passes", type=int, default=2, help="passes over the sweep, alternating order")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--micro_batch", type=int, default=4, help="rows per forward/backward, both sides (ours: "
                    "actor_config.micro_batch_size, its default; TRL: per_device_train_batch_size with gradient "
                    "accumulation over the rollout batch)")
    ap.add_argument("--trl_no_gradient_checkpointing", action="store_true",
                    help="turn off TRL's default gradient checkpointing (its recomputation in the update)")
    ap.add_argument("--torch_threads", type=int, default=os.cpu_count(),
                    help="PyTorch threads on TRL's side (default: every core, as MindSpore uses)")
    ap.add_argument("--shared", default=SHARED, help="folder with data/gsm8k and tokenizers/qwen2_5 (optional)")
    ap.add_argument("--output", default=os.path.join(RESULTS, "grpo_step.json"))
    args = ap.parse_args(argv)

    import mindspore as ms
    import torch
    import transformers
    import trl

    ms.set_context(mode=ms.GRAPH_MODE)
    res = {}
    if args.mode != "all" and os.path.exists(args.output):
        with open(args.output) as f:
            res = json.load(f)  # one mode keeps the other's last results (each part records its own date)
    stamp = dict(run_stamp("benchmarks.grpo_step", argv), code=code_version(),
                 versions=f"mindspore {ms.__version__}, torch {torch.__version__} ({args.torch_threads} threads on "
                          f"TRL's side), transformers {transformers.__version__}, trl {trl.__version__}")
    folder = tempfile.mkdtemp(prefix="grpo_step_")
    try:
        if args.mode in ("compare", "all"):
            res = dict(stamp, configs={}, **({"scaling": res["scaling"]} if "scaling" in res else {}))
            gsm8k = os.path.join(args.shared, "data", "gsm8k", "test.jsonl")
            res["settings"] = (
                f"Work per step: {args.prompts} prompts ({'GSM8K test' if os.path.isfile(gsm8k) else 'synthetic'}, "
                f"{TEMPLATE} template) x G={args.group} x {args.new_tokens} new tokens (forced), fp32, temperature 1, "
                f"top-k 0, top-p 1, beta {BETA} (k3 KL), token-mean loss, lr {LR}, one optimizer step per batch in "
                f"micro-batches of {args.micro_batch} rows, grad clip 1; one warm-up step then {args.steps} "
                f"measured steps per side, each side in its own process, alternating; TRL gradient checkpointing "
                f"{'off' if args.trl_no_gradient_checkpointing else 'on (its default)'}.")
            for name in args.configs:
                res["configs"][name] = compare(name, ALL_CONFIGS[name], folder, args)
            save(res, args.output)
        if args.mode in ("scaling", "all"):
            for k, v in stamp.items():
                res.setdefault(k, v)
            res.setdefault("settings", "")
            base = "tiny-qwen-vocab" if "tiny-qwen-vocab" in args.configs else args.configs[0]
            res["scaling"] = scaling(base, folder, args)
            res["scaling"].update(date=stamp["date"], command=stamp["command"], load_average=stamp["load_average"],
                                  code=stamp["code"], settings=(
                f"{args.prompts} prompts, G={args.group} and {args.new_tokens} new tokens unless varied; micro-batch "
                f"rows scaled so a micro-batch holds {args.micro_batch} x {args.new_tokens} response tokens; "
                f"{args.scaling_passes} passes over the points (every other one in reverse order), each point in a "
                f"fresh process with one warm-up step then {args.scaling_steps} measured; medians over the passes."))
            save(res, args.output)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def save(res: dict, output: str) -> None:
    """The JSON, the markdown beside it and the PNGs (same stem)."""
    stem = os.path.splitext(output)[0]
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if res.get("configs"):
        res["png"] = os.path.basename(stem) + ".png"
        plot_compare(res, stem + ".png")
    if res.get("scaling"):
        res["scaling_png"] = os.path.basename(stem) + "_scaling.png"
        plot_scaling(res["scaling"], stem + "_scaling.png")
    res["load_average_end"] = load_average()
    write_results(output, res, markdown(res))
    print(f"written {output} and {os.path.basename(stem)}.md/.png beside it", flush=True)

