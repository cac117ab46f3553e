"""The scripts with LoRA adapters: convert_weight.py --merge_lora writes the merged HF model (equal to PEFT's
merge_and_unload, the same logits under transformers), its base by default the adapter's
base_model_name_or_path; generate.py --lora samples what the PEFT-merged model samples (and not what the base
does); evaluate.py takes --lora through the same `lora.load_adapter`; a folder that is not an
adapter is one line naming the file."""

import copy
import json

import numpy as np
import pytest

from hf_models import hf_logits, make_hf_model, padded_batch


@pytest.fixture(scope="module")
def hf_and_adapter(tmp_path_factory):
    """An HF Qwen2 with the tiny tokenizer in its folder, a PEFT adapter on it (B non-zero), PEFT's merged model."""
    import torch
    from peft import LoraConfig, get_peft_model

    from mindgrpo.data.synthetic import ArithmeticTask, TinyTokenizerSpec, ensure_tiny_tokenizer

    d = tmp_path_factory.mktemp("lora_scripts")
    tok = ensure_tiny_tokenizer(str(d / "hf"), TinyTokenizerSpec(vocab_size=400, task=ArithmeticTask(num_train=300,
                                                                                                      num_val=50)))
    hf = make_hf_model(str(d / "hf"), vocab=tok.vocab_size, hidden=32, inter=64, layers=1, max_pos=64, seed=2)
    peft_model = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj",
                                                                                                  "down_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    peft_model.eval().save_pretrained(str(d / "adapter"))
    merged = copy.deepcopy(peft_model).merge_and_unload()
    ensure_tiny_tokenizer(str(d / "peft_merged"), TinyTokenizerSpec(vocab_size=400, task=ArithmeticTask(
        num_train=300, num_val=50)))  # first: it makes the folder anew
    merged.save_pretrained(str(d / "peft_merged"))
    return d, peft_model, merged


def test_merge_lora_writes_the_merged_hf_model(hf_and_adapter):
    import transformers

    from mindgrpo.models.convert import read_hf_state
    from scripts import convert_weight

    d, peft_model, merged = hf_and_adapter
    out = d / "merged"
    assert convert_weight.main(["--merge_lora", str(d / "adapter"), "--base", str(d / "hf"),
                                "--torch_ckpt_dir", str(out)]) == 0
    ours = read_hf_state(str(out))
    ref = {k: v.detach().numpy() for k, v in merged.state_dict().items()}
    assert sorted(ours) == sorted(k for k in ref if k != "lm_head.weight" or "lm_head.weight" in ours)
    for name, (_, arr) in ours.items():
        np.testing.assert_allclose(arr, ref[name], rtol=0, atol=1e-6, err_msg=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids, mask = padded_batch(np.random.default_rng(0), 300, [9, 5], 9)
    assert np.abs(hf_logits(loaded, ids, mask) - hf_logits(peft_model, ids, mask))[mask.astype(bool)].max() <= 1e-5


def test_merge_lora_finds_the_base_in_the_adapter(hf_and_adapter):
    """Our adapter files name their base (base_model_name_or_path); PEFT's here name none: --base is asked for."""
    from mindgrpo.models.lora_files import read_adapter, write_adapter
    from scripts import convert_weight

    d, _, _ = hf_and_adapter
    spec, state = read_adapter(str(d / "adapter"))
    ours = write_adapter(str(d / "ours_adapter"), spec, state, base_model=str(d / "hf"))
    assert convert_weight.main(["--merge_lora", ours, "--torch_ckpt_dir", str(d / "merged_default")]) == 0
    a, b = (d / "merged_default" / "model.safetensors").read_bytes(), None
    assert convert_weight.main(["--merge_lora", ours, "--base", str(d / "hf"), "--torch_ckpt_dir",
                                str(d / "merged_given")]) == 0
    b = (d / "merged_given" / "model.safetensors").read_bytes()
    assert a == b


@pytest.mark.slow  # ~10 s of CPU or more (pyproject.toml): CI runs it, the quick loop does not
def test_generate_with_lora_is_the_peft_merged_model(hf_and_adapter, capsys):
    from scripts import generate

    d, _, _ = hf_and_adapter
    # sampled (the tiny random model's greedy choice is one loop with or without the adapter): the same seeds
    args = ["--prompt", "What is 3 + 4?", "--prompt", "What is 12 + 9?", "--max_tokens", "12", "--temperature", "1.0",
            "--n", "2", "--seed", "3"]
    capsys.readouterr()
    assert generate.main(["--model", str(d / "hf"), "--lora", str(d / "adapter")] + args) == 0
    ours = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.strip().splitlines()]
    assert generate.main(["--model", str(d / "peft_merged")] + args) == 0
    theirs = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.strip().splitlines()]
    assert generate.main(["--model", str(d / "hf")] + args) == 0
    base = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.strip().splitlines()]
    assert ours == theirs and ours != base


def test_a_folder_that_is_not_an_adapter_is_one_line(hf_and_adapter, tmp_path, capsys):
    from scripts import generate

    d, _, _ = hf_and_adapter
    capsys.readouterr()
    assert generate.main(["--model", str(d / "hf"), "--lora", str(tmp_path), "--prompt", "x", "--max_tokens", "2"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"generate: error: {tmp_path}/adapter_config.json: no such file (a PEFT adapter folder holds "
        "adapter_config.json and adapter_model.safetensors)"]
