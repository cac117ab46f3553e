"""Partial rollouts with conversations in one process (generate_config.partial_rollout with generate_config.tools or
generate_config.environment; docs/async.md): runs of four steps with off_policy_steps 1 through the trainer, on
micro models whose samples end their turns early and often, so that a step's rollout stops with conversations part
way (mid-turn, or after a tool / environment turn) and they go on in the next step. Each run saves a checkpoint after
step 1, then steps 2 to 4 run again from it in a trainer with nothing in flight (a fresh process's), as
tests/grpo/test_off_policy.py's partial_runs does for plain samples: lr 1e-12 moves the weights by about fp32's
resolution, so the resumed steps draw the straight run's tokens.

Checked: every step trains batch_size complete groups; a conversation really is carried (partial/continued_samples
> 0, a sample in flight at the save with tokens); the carried ones keep their tokens, per-token versions and their
conversation (its tool calls or its environment's steps: the reward columns count every turn, before and after the
park); no prompt is lost or trained twice, over the run and over the stop + resume, and the resumed steps are the
straight run's samples and reward columns. The groups in flight are also started again from their prompts as drawn
after the resume (what a separate placement's rollout rank does; an environment's games reset then): still every
prompt once, an environment's prompts as its resets write them."""

import json
import os

import mindspore as ms
import numpy as np
import pytest

from mindgrpo.config import GRPOConfig, load_config
from mindgrpo.grpo import builder
from mindgrpo.grpo.partial import IN_FLIGHT, PartialRollouts
from mindgrpo.utils.progress import Progress

from fakes import RecordingLog, StepRecorder, one_layer_micro  # tests/grpo is on sys.path under pytest
from tool_caller import TEMPLATE, tool_calling_micro

STEPS, B, G = 4, 2, 4
BASE = [f"rl_config.batch_size={B}", f"rl_config.num_generations={G}", "actor_config.micro_batch_size=8",
        "generate_config.max_num_seqs=8", "synthetic_config.template=raw", "rl_config.val_interval=0",
        "rl_config.completions_interval=0", f"rl_config.max_steps={STEPS}", "reward_config.num_workers=0",
        "sft_config={steps: 0}", "actor_config.lr=1e-12", "rl_config.off_policy_steps=1",
        "generate_config.partial_rollout=true", "rl_config.save_interval=0", "rl_config.keep_last_k=3"]
# the micro model that calls tools (tests/grpo/tool_caller.py): a turn often ends with </tool_call> and a stop token,
# answered by the calculator's error; one tool turn a sample, then a last model turn; every sample of a step's
# prompts decodes at once (16 slots), so that the rollout stops with conversations at every stage
TOOLS = ["generate_config.tools=[calculator]", "generate_config.tool_num_workers=1", "generate_config.max_turns=1",
         "generate_config.tool_response_max_tokens=48", "generate_config.max_prompt_length=64",
         "generate_config.max_tokens=16", "generate_config.max_num_seqs=16", "generate_config.temperature=1.0",
         f"generate_config.chat_template={TEMPLATE}",
         "reward_config.verifier_function=[format]", "reward_config.verifier_weight=[1.0]"]
# guess_number from 1 to 3 (tests/grpo/test_env_run.py's): many stop ids end the micro model's turns early, each
# sample after about eight tokens of its own, some much later; all 16 samples of a step decode at once
ENVIRONMENT = ["generate_config.environment=guess_number", "generate_config.tool_num_workers=1",
               "generate_config.environment_settings={low: 1, high: 3, invalid_reward: -1.0}",
               f"generate_config.chat_template={TEMPLATE}", "generate_config.max_turns=2",
               "generate_config.tool_response_max_tokens=32", "generate_config.max_prompt_length=160",
               "generate_config.max_tokens=24", f"generate_config.stop_token_ids={list(range(3, 200))}",
               "generate_config.max_num_seqs=16",
               "reward_config.verifier_function=[environment]", "reward_config.verifier_weight=[1.0]"]
COLUMNS = {"tools": "tool_calls", "environment": "env_reward"}


def model_for(kind, out):
    if kind == "tools":
        folder = str(out / "tool_caller")
        path = tool_calling_micro(folder, BASE + TOOLS)
        return [f"actor_config.model={os.path.join(folder, 'config.yaml')}", f"actor_config.load_checkpoint={path}"]
    model = one_layer_micro(out)
    with open(model) as f:  # room for the game's prompt, 8 tokens of the model's and two user turns
        text = f.read().replace("max_position_embeddings: 256", "max_position_embeddings: 384")
    with open(model, "w") as f:
        f.write(text)
    return [f"actor_config.model={model}"]


def sample_record(c):
    return (tuple(c.token_ids), c.finish_reason, c.versions.tolist(), int(c.turns), c.model_mask.tolist())


@pytest.fixture(scope="module", params=["tools", "environment"])
def runs(request, tmp_path_factory):
    from scripts.grpo_one_stage import DEFAULT_CONFIG

    kind = request.param
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    out = tmp_path_factory.mktemp(f"partial_{kind}")
    overrides = BASE + (TOOLS if kind == "tools" else ENVIRONMENT) + model_for(kind, out) + \
        [f"rl_config.output_dir={out}"]
    cfg = load_config(GRPOConfig, DEFAULT_CONFIG if kind == "tools" else None, overrides)
    parts = builder.build(cfg, builder.Paths(output_dir=str(out), sft_path_train=cfg.actor_config.load_checkpoint))
    log = RecordingLog()
    trainer = builder.make_trainer(cfg, parts, log, Progress(STEPS), str(out))
    recorder = StepRecorder(trainer, lambda r, m: dict(
        prompts=[tuple(p) for p in r.batch.ids], samples=[sample_record(c) for c in r.completions],
        columns={k: list(r.columns[k]) for k in ("messages", COLUMNS[kind])}, metrics=dict(m)),
        names=("straight", "resumed", "redrawn"))
    trained, steps = recorder.trained, recorder.steps

    conv = parts.conversations
    conv.start()
    try:
        steps(1)
        in_flight = [(tuple(g.prompt), [sample_record(c) for c in g.samples], g.states)
                     for g in trainer.partial.groups]
        saved = trainer.save()
        steps(STEPS - 1)
        recorder.name = "resumed"
        trainer.partial = PartialRollouts(G, cfg.generate_config.max_tokens)
        trainer.resume(saved)
        steps(STEPS - 1)
        # the groups in flight as a separate placement's rollout rank gets them after a resume: their prompts as drawn
        # from the data only (its `redraw`), the conversations started again (an environment's games reset)
        recorder.name = "redrawn"
        trainer.partial = PartialRollouts(G, cfg.generate_config.max_tokens)
        trainer.resume(saved)
        state = trainer.partial.state()
        trainer.partial.load_state(dict(state, groups=[{k: v for k, v in g.items() if k not in ("states", "drawn")} | {
            "prompt": g.get("drawn", g["prompt"]), "samples": []} for g in state["groups"]]))
        steps(STEPS - 1)
    finally:
        conv.close()
        ms.set_context(mode=previous)
    yield dict(kind=kind, trained=trained, in_flight=in_flight, saved=saved, tokenizer=parts.tokenizer,
               drawn=trainer.partial.drawn)


@pytest.mark.slow  # a build and seven steps a kind: about 30 s each
def test_conversations_carried_over_train_every_prompt_once_across_a_stop_and_resume(runs):
    straight, resumed, kind = runs["trained"]["straight"], runs["trained"]["resumed"], runs["kind"]
    assert sorted(straight) == list(range(1, STEPS + 1)) and sorted(resumed) == list(range(2, STEPS + 1))
    for step in list(straight.values()) + list(resumed.values()):  # batch_size complete groups a step
        assert len(step["prompts"]) == B and len(step["samples"]) == B * G
        assert all(reason != "partial" for _, reason, _, _, _ in step["samples"])
    # a conversation really was carried: in flight at the save with tokens, and continued in a later step
    assert any(m["metrics"]["partial/continued_samples"] > 0 for m in straight.values())
    carried = [s for _, samples, _ in runs["in_flight"] for s in samples if s[1] == "partial" and s[0]]
    assert carried, runs["in_flight"]
    if kind == "tools":  # some carried conversation had its tool turn before the park (partial/carried_turns)
        assert any(not all(mask) for _, _, _, _, mask in carried)
        assert any(m["metrics"]["partial/carried_turns"] > 0 for m in straight.values())
    # the checkpoint holds each sample's conversation (JSON: the tool calls, or the environment's pickled state)
    with open(os.path.join(runs["saved"], IN_FLIGHT)) as f:
        saved = json.load(f)
    assert saved["groups"] and all(len(g["states"]) == G for g in saved["groups"])
    if kind == "environment":
        assert all(isinstance(s["state"], str) for g in saved["groups"] for s in g["states"]
                   if s["ended"] is None)
    # the groups in flight at the save train first after the resume, their samples going on from the saved tokens
    # and versions
    assert resumed[2]["prompts"][:len(runs["in_flight"])] == [p for p, _, _ in runs["in_flight"]][:B]
    for (prompt, samples, _), k in zip(runs["in_flight"], range(B)):
        got = resumed[2]["samples"][k * G:(k + 1) * G]
        for (tokens, _, versions, _, _), (after, _, after_versions, _, _) in zip(samples, got):
            assert after[:len(tokens)] == tokens and after_versions[:len(versions)] == versions
    # the resumed steps are the straight run's: prompts, samples (tokens, finish, turns, masks), reward columns
    for step in range(2, STEPS + 1):
        assert resumed[step]["prompts"] == straight[step]["prompts"], step
        assert [s[:2] + s[3:] for s in resumed[step]["samples"]] == [s[:2] + s[3:] for s in straight[step]["samples"]]
        assert resumed[step]["columns"] == straight[step]["columns"], step
    # no prompt lost, none trained twice
    whole = [p for step in [straight[1]] + [resumed[s] for s in range(2, STEPS + 1)] for p in step["prompts"]]
    assert whole == [p for s in range(1, STEPS + 1) for p in straight[s]["prompts"]] and len(set(whole)) == len(whole)
    # started again from their prompts as drawn: every prompt still once, in the straight run's order (an
    # environment's as its resets wrote them: the games of the groups drawn again were reset)
    redrawn = runs["trained"]["redrawn"]
    assert sorted(redrawn) == list(range(2, STEPS + 1))
    again = [p for step in [straight[1]] + [redrawn[s] for s in range(2, STEPS + 1)] for p in step["prompts"]]
    assert again == whole
    for step in redrawn.values():
        assert len(step["samples"]) == B * G and all(reason != "partial" for _, reason, _, _, _ in step["samples"])
    # the groups that were in flight: generated whole after the resume (one version), their tool / game turns too
    first = redrawn[2]["samples"][:len(runs["in_flight"][:B]) * G]
    assert all(len(set(versions)) == 1 for _, _, versions, _, _ in first) and any(t for _, _, _, t, _ in first)
    if kind == "environment":  # their rewards are the games' played again from the reset
        assert all(len(m) >= 2 for m in redrawn[2]["columns"]["messages"])


@pytest.mark.slow
def test_a_carried_conversation_keeps_every_turn_in_its_reward_columns(runs):
    """The columns of a sample that was carried count its turns from before the park too: its conversation's state
    went with it (without it, the calls or the environment's steps of the earlier step would be lost)."""
    carried = 0
    for run in runs["trained"].values():
        for step in run.values():
            for i, (tokens, reason, versions, turns, mask) in enumerate(step["samples"]):
                messages = step["columns"]["messages"][i]
                if runs["kind"] == "tools":  # an assistant message a model turn, a tool message a call answered
                    calls = step["columns"]["tool_calls"][i]
                    assert len(calls) >= turns and sum(m["role"] == "tool" for m in messages) == len(calls)
                    assert sum(m["role"] == "assistant" for m in messages) == turns + 1
                else:  # the first user turn, then one per observation appended; an assistant message a model turn
                    assert sum(m["role"] == "user" for m in messages) == 1 + turns
                    assert sum(m["role"] == "assistant" for m in messages) in (turns, turns + 1)
                if len(set(versions)) > 1:  # carried over a weights change (step 3 to 4; 1 to 2 after the resume)
                    first = versions.index(versions[-1])  # where the newer weights took over
                    carried += turns > 0 and not all(mask[:first])  # ... after a turn was appended
    assert carried, "no conversation was carried across a weights change after one of its turns"
