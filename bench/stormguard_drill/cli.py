"""``stormguard-drill``: calibrate, run every pairing, print the table, write JSON and plots.

``--scenario`` picks what is replayed (config.py): the OOM avalanche (the default), the
burst against a server that sheds, or the rebound after a cold start. Each has its own
engine flags, schedule, patience, default clients and server modes; the calibration,
the replay, the sampler and the summary are the same code for all three. The fourth,
``fleet`` (a partial outage of several replicas under several client processes), has
its own runner, figures and plots (the ``fleet`` subpackage) and shares the rest; the
fifth, ``quota`` (a batch job of several processes on one API key against a hosted
API's quota, ``quota/``), the sixth, ``outage`` (a primary provider in partial
outage and a secondary, ``outage/``), and the seventh, ``replicas`` (affinity and
hedging over replicas with prefix caching, ``replicas/``), have their own runner and
figures, and no plots.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from tqdm import tqdm

from stormguard_drill.clients.drill_client import AVALANCHE_CLIENTS, CLIENT_NAMES, ClientName
from stormguard_drill.clients.registry import unavailable
from stormguard_drill.config import (
    BURST_SKIP_OFF_REASON,
    COLD_START_S,
    ENGINES,
    SCENARIOS,
    BacklogWorkload,
    DrillConfig,
    Mode,
    Scenario,
    engine_args,
    preset,
)
from stormguard_drill.fleet.clients import FLEET_CLIENTS
from stormguard_drill.fleet.config import fleet_preset
from stormguard_drill.fleet.drill import fleet_drill, fleet_marks, fleet_targets_line
from stormguard_drill.fleet.plots import plot_fleet
from stormguard_drill.outage.clients import OUTAGE_CLIENTS
from stormguard_drill.outage.config import outage_preset
from stormguard_drill.outage.drill import outage_drill
from stormguard_drill.outage.summary import targets_line
from stormguard_drill.plots import plot_all
from stormguard_drill.quota.client_names import QUOTA_CLIENTS, QuotaClientName
from stormguard_drill.quota.clients import quota_unavailable
from stormguard_drill.quota.config import (
    BOUNDS,
    Bound,
    QuotaVariant,
    cross_variants,
    default_variants,
    quota_preset,
)
from stormguard_drill.quota.drill import quota_drill
from stormguard_drill.quota.summary import quota_targets_line
from stormguard_drill.records import ADMISSIONS, Admission
from stormguard_drill.replicas.clients import REPLICAS_CLIENTS
from stormguard_drill.replicas.config import replicas_preset
from stormguard_drill.replicas.drill import replicas_drill
from stormguard_drill.replicas.summary import targets_line as replicas_targets_line
from stormguard_drill.report import (
    load_average,
    machine,
    markdown_table,
    source,
    table,
    write_json,
)
from stormguard_drill.runner import calibrate as run_calibration
from stormguard_drill.runner import run_all, warm_up
from stormguard_drill.servers import EngineSpec, ServerFleet
from stormguard_drill.summary import summarize
from stormguard_drill.vllm import SKIP_OFF_REASON, build_model, engine_spec
from stormguard_drill.workload import build_schedule
from stormguard_server.config import RETRY_AFTER_MODES, RetryAfterMode
from stormguard_server.vllm.launch import check_environment

_Name = TypeVar("_Name", bound=str)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stormguard-drill",
        description="Incidents replayed on the reference server: every client x every "
        "server mode (admission off, on) under the same seeded workload, each pairing on a "
        "fresh server. Scenarios: avalanche (the OOM avalanche: openai, openai+tenacity, "
        "stormguard), burst (300 calls at once against a server that sheds; admission on "
        "only) and rebound (the engine crashes while a backlog waits; no second crash may "
        "follow), the last two with every client, openai on stormguard's httpx transport "
        "and LiteLLM included. fleet: a partial outage of four replicas under three client "
        "processes, each with its own client: steady traffic, then one replica killed (its "
        "port closed), one crashed again each time it comes back (an OOM restart loop), one "
        "slowed by 2 s a request, then all recovered (the dead one restarted on its port) "
        "and the traffic's rebound; openai picking a replica at random per call, LiteLLM "
        "Router over the replicas and stormguard over the replicas, each on a fresh fleet, "
        "admission on by default. quota: a batch job of P worker processes x W threads (or "
        "tasks) on ONE API key against a hosted API's quota (the server's --quota-tpm/rpm: "
        "OpenAI's 429s, Retry-After, x-ratelimit headers), every client side by side "
        "(stormguard sync and async, openai, openai+tenacity, openai on stormguard's "
        "transport, LiteLLM Router with tpm/rpm, and with Redis), each on a fresh server; "
        "variants by --processes, --bound, --retry-after, --headers. "
        "outage: a primary provider in partial outage (a share of 500s, a share of calls "
        "hanging to their deadline, x10 time to first token on the rest) for 60 s, then "
        "recovering over 30 s, and a healthy secondary with a higher latency: stormguard "
        "(two Deployments), LiteLLM Router (a model group each, fallbacks) and openai on the "
        "primary alone (with and without tenacity), each on its own two servers; the quick "
        "run's pairings at once (--concurrency N: N at once). "
        "replicas: three replicas with prefix caching, one pairing at a time; multi-turn "
        "conversations over shared system prompts (stormguard, stormguard with affinity "
        "keyed by conversation, LiteLLM Router least-busy: prefill computed, TTFT, balance), "
        "then one replica slow for the middle of the run (stormguard, stormguard with "
        "HedgePolicy(), LiteLLM Router: TTFT p99, requests per call, loser tokens). "
        "Traffic goes to 127.0.0.1 only.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--scenario", default="avalanche", choices=SCENARIOS, help="what the drill replays"
    )
    parser.add_argument("--quick", action="store_true", help="short run (under 2 minutes)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the e2e test
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload and engine")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default bench/results/drill-MODE)"
    )
    parser.add_argument(
        "--engine",
        default="sim",
        choices=ENGINES,
        help="engine of the servers: the simulator, or real vLLM on a tiny local model"
        " (admission-on pairings only; needs the .venv-vllm environment, docs/vllm.md)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="pairings run at once, each on its own server; 1 keeps them from competing for CPU"
        " (the fleet runs one pairing at a time)",
    )
    parser.add_argument(
        "--clients",
        default=None,
        help="comma-separated subset of clients, of: "
        + ", ".join(CLIENT_NAMES)
        + f" (default: {', '.join(AVALANCHE_CLIENTS)} in the avalanche, "
        + f"{', '.join(FLEET_CLIENTS)} in the fleet (its only clients), all in the others; "
        + f"the quota's: {', '.join(QUOTA_CLIENTS)}, all by default; "
        + f"the outage's: {', '.join(OUTAGE_CLIENTS)}, all by default; "
        + f"the replicas': {', '.join(REPLICAS_CLIENTS)}, all by default)",
    )
    parser.add_argument(
        "--admission",
        default=None,
        help="comma-separated subset of server modes (default: off,on; on in the fleet;"
        " the quota's server runs admission on)",
    )
    quota = parser.add_argument_group(
        "quota",
        "The quota scenario's variants. Without any of these flags: its default matrix"
        " (full: 4 processes, TPM-bound, retry-after in seconds, x-ratelimit headers on;"
        " then 1 and 16 processes, no Retry-After, no headers, RPM-bound, one change at a"
        " time). With any: every combination of the values given, the base for the rest.",
    )
    quota.add_argument(
        "--processes", default=None, metavar="P,...", help="worker processes, e.g. 1,4,16"
    )
    quota.add_argument(
        "--bound", default=None, metavar="tpm,rpm", help="the limit that binds: tpm, rpm"
    )
    quota.add_argument(
        "--retry-after",
        default=None,
        metavar="MODE,...",
        help=f"what a quota 429 says, of: {', '.join(RETRY_AFTER_MODES)}",
    )
    quota.add_argument(
        "--headers", default=None, metavar="on,off", help="the x-ratelimit-* headers: on, off"
    )
    quota.add_argument(
        "--calls", type=int, default=None, help="calls in the batch (default: the size's)"
    )
    quota.add_argument(
        "--stream",
        action="store_true",
        help="stream every call (default: whole answers, as a batch job asks for them)",
    )
    quota.add_argument(
        "--workers",
        type=int,
        default=None,
        help="threads (or tasks) per worker process (default: the size's)",
    )
    return parser


def default_clients(scenario: Scenario) -> tuple[ClientName, ...]:
    if scenario == "fleet":
        return FLEET_CLIENTS
    return AVALANCHE_CLIENTS if scenario == "avalanche" else CLIENT_NAMES


def _pairings(
    args: argparse.Namespace, skipped: dict[str, str]
) -> list[tuple[ClientName, Admission]]:
    """The pairings asked for; what cannot run is left out, said on stderr and noted in
    ``skipped`` (name -> reason)."""
    scenario: Scenario = args.scenario
    if args.clients is None:
        clients = list(default_clients(scenario))
    else:
        asked = [c.strip() for c in args.clients.split(",") if c.strip()]
        known = FLEET_CLIENTS if scenario == "fleet" else CLIENT_NAMES
        unknown = sorted(set(asked) - set(known))
        if unknown:
            raise SystemExit(
                f"unknown clients {unknown} for the {scenario}: choose from {', '.join(known)}"
            )
        clients = [c for c in known if c in asked]
    admission = args.admission or ("on" if scenario == "fleet" else "off,on")
    admissions = [a for a in ADMISSIONS if a in admission.split(",")]
    if args.engine == "vllm" and "off" in admissions:
        skipped["admission off"] = SKIP_OFF_REASON
        admissions.remove("off")
    if scenario == "burst" and "off" in admissions:
        skipped["admission off"] = BURST_SKIP_OFF_REASON
        admissions.remove("off")
    for name, reason in unavailable(clients).items():
        skipped[name] = reason
        clients.remove(name)
    for reason in dict.fromkeys(skipped.values()):
        print(f"skipped: {reason}", file=sys.stderr)
    if not clients or not admissions:
        raise SystemExit("no pairing selected: check --clients and --admission")
    return [(c, a) for a in admissions for c in clients]


async def drill(
    config: DrillConfig,
    out: Path,
    pairings: list[tuple[ClientName, Admission]],
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole drill; returns the JSON document."""
    skipped = skipped or {}
    if config.engine != "vllm":
        spec = EngineSpec(args=engine_args(config.engine, config.scenario))
        return await _drill(config, out, pairings, spec, skipped)
    # Without vLLM (the default .venv), say how to get it before building anything.
    check_environment()
    # The tiny model lives as long as the run: built offline once, shared by every server.
    with tempfile.TemporaryDirectory(prefix="stormguard-drill-model-") as tmp:
        print("building the tiny model ...", file=sys.stderr)
        model = await asyncio.to_thread(build_model, Path(tmp) / "tiny-llama")
        return await _drill(config, out, pairings, engine_spec(model), skipped)


async def _drill(
    config: DrillConfig,
    out: Path,
    pairings: list[tuple[ClientName, Admission]],
    spec: EngineSpec,
    skipped: dict[str, str],
) -> dict[str, Any]:
    schedule = build_schedule(config.workload, config.seed)
    started = time.monotonic()
    host = machine()
    code = source()
    async with ServerFleet(out / "logs", spec) as fleet:
        print(f"calibrating for {config.calibration_s:.0f} s ...", file=sys.stderr)
        calibration = await run_calibration(fleet, config)
        print(f"capacity: {calibration.capacity_tps:.0f} completion tokens/s", file=sys.stderr)
        if config.engine == "sim":  # a vLLM server takes ~20 s to start: not for this
            await warm_up(fleet, config, [client for client, _ in pairings])
        with tqdm(total=len(schedule) * len(pairings), unit="req", file=sys.stderr) as bar:
            runs = await run_all(fleet, config, schedule, pairings, bar.update)
    summaries = [
        summarize(run, config.workload, calibration.capacity_tps, config.targets) for run in runs
    ]
    return {
        "scenario": config.scenario,
        "mode": config.mode,
        "seed": config.seed,
        "engine": config.engine,
        "engine_args": list(spec.args),
        # The sim's restart time; vLLM does not restart in the drill.
        "cold_start_s": COLD_START_S if config.engine == "sim" else None,
        "skipped": skipped,
        "concurrency": config.concurrency,
        "workload": asdict(config.workload),
        "patience": asdict(config.patience),
        "targets": None if config.targets is None else asdict(config.targets),
        "logical_requests_per_pairing": len(schedule),
        "calibration": asdict(calibration),
        "machine": {**host, "load_average_at_end": load_average()},
        "source": code,
        "wall_time_s": round(time.monotonic() - started, 1),
        "pairings": summaries,
    }


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # SIGTERM and SIGINT take the same way out, through every server's stop().
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    mode: Mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    scenario: Scenario = args.scenario
    if scenario != "avalanche" and args.engine != "sim":
        raise SystemExit(f"--scenario {scenario} runs on the sim engine only")
    if scenario == "fleet":
        _fleet_main(args, mode)
        return
    if scenario == "quota":
        _quota_main(args, mode)
        return
    if scenario == "outage":
        _outage_main(args, mode)
        return
    if scenario == "replicas":
        _replicas_main(args, mode)
        return
    config = preset(
        mode,
        seed=args.seed,
        concurrency=max(1, args.concurrency),
        engine=args.engine,
        scenario=scenario,
    )
    name = f"drill-{mode}" if scenario == "avalanche" else f"drill-{scenario}-{mode}"
    out: Path = args.out or Path("bench/results") / name
    skipped: dict[str, str] = {}
    pairings = _pairings(args, skipped)
    try:
        document = asyncio.run(drill(config, out, pairings, skipped))
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        raise SystemExit(130) from None
    write_json(out / "drill.json", document)
    span, label = _shaded(config)
    plots = plot_all(document["pairings"], span, out, label)
    (out / "table.md").write_text(markdown_table(document["pairings"], scenario) + "\n")
    print(table(document["pairings"], scenario))
    print(
        f"\ncapacity {document['calibration']['capacity_tps']:.0f} tok/s; "
        f"wall time {document['wall_time_s']} s"
    )
    if config.targets is not None:
        print(f"targets: {_targets_line(config)}")
    print(f"JSON: {out / 'drill.json'}; plots: {', '.join(p.name for p in plots)}")


def _fleet_main(args: argparse.Namespace, mode: Mode) -> None:
    config = fleet_preset(mode, seed=args.seed)
    out: Path = args.out or Path("bench/results") / f"drill-fleet-{mode}"
    skipped: dict[str, str] = {}
    pairings = _pairings(args, skipped)
    try:
        document = asyncio.run(fleet_drill(config, out, pairings, skipped))
    except KeyboardInterrupt:
        print("interrupted: every server and client process was stopped", file=sys.stderr)
        raise SystemExit(130) from None
    write_json(out / "drill.json", document)
    plots = plot_fleet(document["pairings"], fleet_marks(config), out)
    (out / "table.md").write_text(markdown_table(document["pairings"], "fleet") + "\n")
    print(table(document["pairings"], "fleet"))
    print(f"\nwall time {document['wall_time_s']} s")
    for pairing in document["pairings"]:
        if pairing["fault_errors"]:
            print(f"faults not done ({pairing['client']}): {pairing['fault_errors']}")
    print(f"targets: {fleet_targets_line(config)}")
    print(f"JSON: {out / 'drill.json'}; plots: {', '.join(p.name for p in plots)}")


def _values(text: str | None, flag: str, choices: Sequence[str]) -> tuple[str, ...] | None:
    """A comma-separated flag's values (None when not given), each one of ``choices``."""
    if text is None:
        return None
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    unknown = [v for v in values if v not in choices]
    if unknown or not values:
        raise SystemExit(f"{flag}: choose from {', '.join(choices)} (got {text!r})")
    return values


def _quota_variants(args: argparse.Namespace, mode: Mode) -> tuple[QuotaVariant, ...]:
    """The default matrix, or the cross product of the variant flags given."""
    processes: tuple[int, ...] | None = None
    if args.processes is not None:
        try:
            processes = tuple(dict.fromkeys(int(p) for p in args.processes.split(",") if p))
        except ValueError:
            raise SystemExit(f"--processes: whole numbers, got {args.processes!r}") from None
        if not processes or min(processes) < 1:
            raise SystemExit(f"--processes: at least 1 each, got {args.processes!r}")
    bounds: tuple[Bound, ...] | None = _values(args.bound, "--bound", BOUNDS)  # type: ignore[assignment]
    retry_afters: tuple[RetryAfterMode, ...] | None = _values(  # type: ignore[assignment]
        args.retry_after, "--retry-after", RETRY_AFTER_MODES
    )
    headers_given = _values(args.headers, "--headers", ("on", "off"))
    headers = None if headers_given is None else tuple(h == "on" for h in headers_given)
    if all(given is None for given in (processes, bounds, retry_afters, headers)):
        return default_variants(mode)
    return cross_variants(mode, processes, bounds, retry_afters, headers)


def _quota_clients(args: argparse.Namespace, skipped: dict[str, str]) -> list[QuotaClientName]:
    """The quota's clients asked for; what cannot run is left out, said on stderr and
    noted in ``skipped``."""
    asked = _values(args.clients, "--clients", QUOTA_CLIENTS)
    clients = [c for c in QUOTA_CLIENTS if asked is None or c in asked]
    for name, reason in quota_unavailable(tuple(clients)).items():
        skipped[name] = reason
        clients.remove(name)
        print(f"skipped {name}: {reason}", file=sys.stderr)
    if not clients:
        raise SystemExit("no client selected: check --clients")
    return clients


def _run_and_report(
    drill: Coroutine[Any, Any, dict[str, Any]], out: Path, scenario: str, stopped: str
) -> dict[str, Any]:
    """Run a scenario's drill; write its JSON and table, print the table. Ctrl-C says
    what was ``stopped`` and exits 130."""
    try:
        document = asyncio.run(drill)
    except KeyboardInterrupt:
        print(f"interrupted: {stopped}", file=sys.stderr)
        raise SystemExit(130) from None
    write_json(out / "drill.json", document)
    (out / "table.md").write_text(markdown_table(document["pairings"], scenario) + "\n")
    print(table(document["pairings"], scenario))
    return document


def _quota_main(args: argparse.Namespace, mode: Mode) -> None:
    for flag in ("calls", "workers"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise SystemExit(f"--{flag}: at least 1, got {value}")
    config = quota_preset(
        mode,
        seed=args.seed,
        concurrency=max(1, args.concurrency),
        variants=_quota_variants(args, mode),
        calls=args.calls,
        workers=args.workers,
        stream=args.stream,
    )
    out: Path = args.out or Path("bench/results") / f"drill-quota-{mode}"
    skipped: dict[str, str] = {}
    clients = _quota_clients(args, skipped)
    document = _run_and_report(
        quota_drill(config, out, clients, skipped),
        out,
        "quota",
        "every server, Redis and worker process was stopped",
    )
    for pairing, error in document["failed"].items():
        print(f"FAILED (left out of the table): {pairing}: {error}", file=sys.stderr)
    workload = config.workload
    demand = document["demand_tokens"]
    print(
        f"\nbatch: {workload.calls} calls ({demand} tokens at the server, "
        f"~{demand / workload.calls:.0f} a call), {workload.workers} workers a process, "
        f"{workload.deadline_s:.0f} s a call, "
        f"{'streamed' if config.stream else 'whole answers'}; "
        f"wall time {document['wall_time_s']} s"
    )
    print(f"targets: {quota_targets_line(config.targets)}")
    print(f"JSON: {out / 'drill.json'}")


def _router_scenario_clients(
    args: argparse.Namespace, names: tuple[_Name, ...], skipped: dict[str, str]
) -> list[_Name]:
    """The scenario's clients asked for; LiteLLM's Router is left out where it cannot run."""
    asked = _values(args.clients, "--clients", names)
    clients = [c for c in names if asked is None or c in asked]
    if "litellm-router" in clients:
        reason = unavailable(("litellm-router",)).get("litellm-router")
        if reason is not None:
            skipped["litellm-router"] = reason
            clients = [c for c in clients if c != "litellm-router"]
            print(f"skipped litellm-router: {reason}", file=sys.stderr)
    if not clients:
        raise SystemExit("no client selected: check --clients")
    return clients


def _outage_main(args: argparse.Namespace, mode: Mode) -> None:
    given = args.concurrency if args.concurrency != 1 else None
    config = outage_preset(mode, seed=args.seed, concurrency=given)
    out: Path = args.out or Path("bench/results") / f"drill-outage-{mode}"
    skipped: dict[str, str] = {}
    clients = _router_scenario_clients(args, OUTAGE_CLIENTS, skipped)
    document = _run_and_report(
        outage_drill(config, out, clients, skipped), out, "outage", "every server was stopped"
    )
    for pairing in document["pairings"]:
        if pairing["fault_errors"]:
            print(f"faults not done ({pairing['client']}): {pairing['fault_errors']}")
    print(
        f"\n{config.rate:g} calls/s; healthy {config.healthy_s:g} s, outage {config.outage_s:g} s,"
        f" recovery {config.recovery_s:g} s, after {config.after_s:g} s; deadline"
        f" {config.deadline_s:g} s a call; wall time {document['wall_time_s']} s"
    )
    print(f"targets (stormguard): {targets_line(document['targets_checked'])}")
    print(f"JSON: {out / 'drill.json'}")


def _replicas_main(args: argparse.Namespace, mode: Mode) -> None:
    config = replicas_preset(mode, seed=args.seed)
    out: Path = args.out or Path("bench/results") / f"drill-replicas-{mode}"
    skipped: dict[str, str] = {}
    clients = _router_scenario_clients(args, REPLICAS_CLIENTS, skipped)
    document = _run_and_report(
        replicas_drill(config, out, clients, skipped), out, "replicas", "every replica was stopped"
    )
    sizing = document["sizing"]
    print(
        f"\n{config.replicas} replicas, KV cache {sizing['kv_blocks']} blocks of 16 each"
        f" (all conversations' distinct prompt tokens: {sizing['working_set_tokens']});"
        f" hedging: {config.rate:g} calls/s for {config.hedge_s:g} s, the last replica"
        f" {config.slow_ms:g} ms slower over [{config.slow_from_s:g}, {config.slow_until_s:g}) s;"
        f" wall time {document['wall_time_s']} s"
    )
    print(f"claims: {replicas_targets_line(document['targets_checked'])}")
    print(f"JSON: {out / 'drill.json'}")


def _shaded(config: DrillConfig) -> tuple[tuple[float, float] | None, str]:
    """The plots' grey window: the avalanche's burst, the rebound's crash and cold start."""
    workload = config.workload
    if not isinstance(workload, BacklogWorkload):
        return (workload.burst_start_s, workload.burst_end_s), "burst of long prompts"
    if workload.crash_at_s is not None:
        crash = workload.crash_at_s
        return (crash, crash + COLD_START_S), "engine crashed, cold start"
    return None, ""


def _targets_line(config: DrillConfig) -> str:
    targets = config.targets
    assert targets is not None
    parts = [
        f"success >= {targets.min_success:.0%}",
        f"attempts/call <= {targets.max_attempts_per_call}",
    ]
    if targets.min_goodput_ratio is not None:
        parts.append(f"goodput >= {targets.min_goodput_ratio:.0%} of capacity")
    if targets.max_p99_over_drain is not None:
        parts.append(f"p99 <= {targets.max_p99_over_drain} x drain")
    if targets.max_extra_crashes is not None:
        parts.append(f"crashes beyond the drill's own <= {targets.max_extra_crashes}")
    return "; ".join(parts) + " (for stormguard; every row is checked)"


if __name__ == "__main__":
    main()
