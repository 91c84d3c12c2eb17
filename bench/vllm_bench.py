"""What the benchmarks on real vLLM share (``bench_affinity.py``, ``bench_hedging.py``):
two replicas of the tiny model on free loopback ports, each bound to a core of its
own; their Prometheus counters; the token count of a prompt; LiteLLM's Router over
them; and the arithmetic and layout of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.vllm.vllm_process

MODEL = "tiny"
BLOCK_SIZE = 32


def kv_bytes_per_token(model_dir: str) -> int:
    """Bytes of KV cache per token of the model in ``model_dir``, from its
    config.json: 2 (K and V) x layers x KV heads x head dimensions x 2 bytes (vLLM's
    CPU build keeps it in bf16). The tiny model's 1,024 (2 layers x 4 heads x 32) was
    checked against the capacity vLLM reports (``vllm:cache_config_info``)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * 2


T = TypeVar("T")


# -- the arithmetic ----------------------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus sample ``name`` over the label sets that have ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def percentile(values: Sequence[float], p: int) -> float | None:
    """Inclusive percentile ``p`` (1-99) of ``values``; None for fewer than two."""
    if len(values) < 2:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spread(values: Sequence[float | None], spec: str) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    mid = format(statistics.median(known), spec)
    if len(known) == 1:
        return mid
    return f"{mid} [{format(min(known), spec)}-{format(max(known), spec)}]"


def prompt_ids(model_dir: str) -> Callable[[list[Any]], list[int]]:
    """The token ids vLLM prefills for a list of messages: its chat template with the
    generation prompt, tokenized without special tokens (as vLLM's chat endpoint does)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def ids(messages: list[Any]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    return ids


# -- the replicas ------------------------------------------------------------------------


@dataclass
class Replica:
    root: str
    port: int

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def metrics(self) -> str:
        """The replica's Prometheus text (``/metrics``)."""
        return httpx.get(f"{self.root}/metrics", timeout=30).text

    def capacity_tokens(self) -> int:
        text = self.metrics()
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:cache_config_info":
                    blocks = sample.labels.get("num_gpu_blocks") or sample.labels.get(
                        "num_cpu_blocks", "0"
                    )
                    return int(blocks) * int(sample.labels.get("block_size", BLOCK_SIZE))
        return 0

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache; vLLM refuses while blocks are held, so try again."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reply = httpx.post(f"{self.root}/reset_prefix_cache", timeout=30)
            if reply.status_code == 200 and reply.json().get("success"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{self.root} would not reset its prefix cache in 60 s")


@contextlib.contextmanager
def vllm_replicas(
    model_dir: str, *, max_model_len: int, kv_tokens: int, count: int = 2
) -> Iterator[list[Replica]]:
    """``count`` plain vLLM servers, each stopped as a process group when the block ends."""
    from tests.vllm.vllm_process import run_vllm

    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache
    extra = (
        "--served-model-name", MODEL,
        "--max-model-len", str(max_model_len),
        "--kv-cache-memory-bytes", str(kv_tokens * kv_bytes_per_token(model_dir)),
        "--block-size", str(BLOCK_SIZE),
        "--enable-prefix-caching",
        "--enforce-eager",
    )  # fmt: skip
    cores = os.sched_getaffinity(0)
    with contextlib.ExitStack() as stack:
        replicas = []
        for index in range(count):
            # One core each, as GPUs would be: left to itself, each replica binds its
            # compute threads to the first core (VLLM_CPU_OMP_THREADS_BIND=auto reserves
            # the rest), so they would take turns on one core and the load-aware clients
            # would pile onto whichever was running. More replicas than cores share them
            # in turn (the third takes the first core again).
            core = sorted(cores)[index % len(cores)]
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
            server = stack.enter_context(run_vllm(model_dir, admission=False, extra=extra))
            bound = [line for line in server.log().splitlines() if "core ids=" in line]
            print(f"replica {index}: {bound[-1].split(']', 1)[-1].strip() if bound else '?'}")
            replicas.append(Replica(root=server.root, port=server.port))
        yield replicas


# -- LiteLLM -----------------------------------------------------------------------------


def litellm_router(replicas: Sequence[Replica], **options: Any) -> Any:
    """LiteLLM's ``Router`` with a deployment per replica (``hosted_vllm/``, its id the
    replica's port) and ``options`` (its routing strategy, retries, checks)."""
    from stormguard_drill.clients.litellm_client import import_litellm

    litellm = import_litellm()
    model_list = [
        {
            "model_name": MODEL,
            "litellm_params": {
                "model": f"hosted_vllm/{MODEL}",
                "api_base": r.base_url,
                "api_key": "none",
            },
            "model_info": {"id": str(r.port)},
        }
        for r in replicas
    ]
    return litellm.Router(model_list=model_list, **options)


# -- the command line and the report -----------------------------------------------------


def parser_for(
    doc: str, *, quick: str, clients: Sequence[str], shape: type[Any], rounds: int | None
) -> argparse.ArgumentParser:
    """The options every benchmark on vLLM takes: ``--quick``, ``--seed``, ``--rounds``,
    ``--clients``, ``--model-dir``, ``--json``, and one per field of the dataclass
    ``shape`` (``--a-field``; default: the shape's, or the quick one's)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--clients", default=",".join(clients))
    for f in fields(shape):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), dest=f.name)
    parser.add_argument("--model-dir", help="a model built by tiny_model (default: build one)")
    parser.add_argument("--json", help="write every run's figures to this file")
    return parser


def shape_from(args: argparse.Namespace, base: T) -> T:
    """``base`` with each field given on the command line replaced."""
    given = {f.name: getattr(args, f.name) for f in fields(base)}  # type: ignore[arg-type]
    return type(base)(**{k: v if v is not None else getattr(base, k) for k, v in given.items()})


def client_list(parser: argparse.ArgumentParser, text: str, known: Sequence[str]) -> list[str]:
    """The clients named in ``text`` (comma-separated), each one of ``known``."""
    clients = [c.strip() for c in text.split(",") if c.strip()]
    for name in clients:
        if name not in known:
            parser.error(f"unknown client {name!r}; one of {', '.join(known)}")
    return clients


@dataclass(frozen=True)
class Column:
    """A column of ``table``: its title and width, a round's value and its format."""

    title: str
    width: int
    value: Callable[[Mapping[str, Any]], Any]
    spec: str
    #: The sum over the rounds, rather than their median [min-max].
    total: bool = False


def table(
    results: Sequence[Mapping[str, Any]],
    clients: Sequence[str],
    columns: Sequence[Column],
    *,
    width: int = 18,
) -> str:
    """Each client's figures: the median over rounds, [min-max] with more than one."""
    header = f"{'client':<{width}}" + "".join(f" {c.title:>{c.width}}" for c in columns)
    lines = [header, "-" * len(header)]
    for name in clients:
        rows = [f for f in results if f["client"] == name]
        if not rows:
            continue
        cells = []
        for column in columns:
            values = [column.value(f) for f in rows]
            if column.total:
                known = [v for v in values if v is not None]
                cell = fmt(sum(known) if known else None, column.spec)
            else:
                cell = spread(values, column.spec)
            cells.append(f" {cell:>{column.width}}")
        lines.append(f"{name:<{width}}" + "".join(cells))
    return "\n".join(lines)


def print_verdicts(
    results: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    verdicts: Callable[[Mapping[str, Any]], Mapping[str, bool | None]],
) -> None:
    """One line per round of each client in ``names``: which targets it met."""
    for name in names:
        for figures in (f for f in results if f["client"] == name):
            met = verdicts(figures)
            print(
                f"{name} round {figures['round']}: "
                + ", ".join(
                    f"{k} {'met' if v else 'MISSED' if v is not None else '-'}"
                    for k, v in met.items()
                )
            )


def tiny_model(model_dir: str | None, scratch: str) -> str:
    """``model_dir``, or the tiny model built in ``scratch``."""
    if model_dir is not None:
        return model_dir
    from stormguard_server.vllm.tiny_model import build_tiny_model

    return str(build_tiny_model(Path(scratch) / "tiny-llama"))
