"""The drill's vLLM workload fits the tiny model (``stormguard-drill --engine vllm``).

The prompt shapes are in server tokens, made of words that the tiny model's
tokenizer splits (config.VLLM_TOKENS_PER_WORD): counted here with that tokenizer
and chat template, every request fits max_model_len and the long prompts are long
enough to press the 3840-token KV cache. No vLLM server is started.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from stormguard_drill.config import VLLM_ENGINE_ARGS, Mode, preset
from stormguard_drill.workload import build_schedule

MAX_MODEL_LEN = int(VLLM_ENGINE_ARGS[VLLM_ENGINE_ARGS.index("--max-model-len") + 1])


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_vllm_prompts_fit_the_tiny_model(tiny_model: str, mode: Mode) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    workload = preset(mode, engine="vllm").workload
    lengths: dict[str, list[int]] = {"short": [], "long": []}
    for arrival in build_schedule(workload, seed=0):
        text = tokenizer.apply_chat_template(
            arrival.messages, add_generation_prompt=True, tokenize=False
        )
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        assert tokens + arrival.max_tokens <= MAX_MODEL_LEN, (arrival.index, tokens)
        lengths[arrival.kind].append(tokens)
    long = lengths["long"]
    # Within ~10% of the 600-800 shape; four of them (+128 each) fit the 3456-token budget.
    assert min(long) >= 540 and max(long) <= 880, long
    assert 30 <= sum(lengths["short"]) / len(lengths["short"]) <= 90
