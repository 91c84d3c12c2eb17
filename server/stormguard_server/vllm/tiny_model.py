"""Build a tiny Llama with random weights and a locally trained tokenizer, offline.

vLLM needs a real model directory (config.json, safetensors weights, a
tokenizer with a chat template). No hub can be reached here, so the tests,
the demo and the drill build one: 2 layers, hidden size 128, 4 heads, a
byte-level BPE tokenizer of 4096 tokens trained on text generated from a
seed. It answers nonsense, fast, which is all a test of admission, shedding,
streaming and aborts needs; on 2 CPU cores vLLM serves it at thousands of
tokens per second.

    python -m stormguard_server.vllm.tiny_model /tmp/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "build_tiny_model"]

# A minimal chat template (what vLLM's /v1/chat/completions renders prompts with).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "be",
    "this",
    "are",
    "from",
    "at",
    "or",
    "have",
    "not",
    "token",
    "cache",
    "queue",
    "model",
    "server",
    "request",
    "retry",
    "budget",
    "shed",
    "load",
    "memory",
    "block",
    "prompt",
    "engine",
    "restart",
    "ready",
    "deadline",
    "priority",
    "admission",
    "stream",
    "chunk",
    "latency",
    "throughput",
    "overload",
    "breaker",
    "fallback",
    "small",
    "large",
    "long",
    "short",
    "fast",
    "slow",
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "hello",
    "world",
    "answer",
    "question",
    "data",
    "value",
    "result",
    "error",
]


def _corpus(seed: int, lines: int = 20_000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24))) for _ in range(lines)]


def build_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 4096,
    hidden_size: int = 128,
    layers: int = 2,
) -> Path:
    """Write the model directory at ``path`` (created; existing files replaced).
    ``hidden_size`` and ``layers`` make a larger model (heads of 32 dimensions, an
    MLP twice the hidden size), for a benchmark whose prefill must cost more than
    vLLM's per-step overhead: hidden size 512 and 4 layers do about 30 times the
    tiny model's work per token."""
    if hidden_size < 32 or hidden_size % 32 or layers < 1:
        raise ValueError(
            f"hidden_size must be a multiple of 32 and layers >= 1, got {hidden_size}, {layers}"
        )
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        additional_special_tokens=special[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=hidden_size // 32,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "stormguard-tiny-model.json").write_text(
        json.dumps({"seed": seed, "vocab_size": len(fast), "built_by": __name__}) + "\n"
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and tokenizer")
    parser.add_argument("--hidden-size", type=int, default=128, help="a multiple of 32")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    print(
        build_tiny_model(
            args.path, seed=args.seed, hidden_size=args.hidden_size, layers=args.layers
        )
    )


if __name__ == "__main__":
    main()
