"""``stormguard-drill``: calibrate, run every pairing, print the table, write JSON and plots."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from tqdm import tqdm

from stormguard_server.drill.clients import CLIENT_NAMES, ClientName
from stormguard_server.drill.config import (
    COLD_START_S,
    ENGINE_ARGS,
    ENGINES,
    DrillConfig,
    Engine,
    Mode,
    preset,
)
from stormguard_server.drill.plots import plot_all
from stormguard_server.drill.report import (
    load_average,
    machine,
    markdown_table,
    table,
    write_json,
)
from stormguard_server.drill.runner import ADMISSIONS, Admission, run_all
from stormguard_server.drill.runner import calibrate as run_calibration
from stormguard_server.drill.servers import EngineSpec, ServerFleet
from stormguard_server.drill.summary import summarize
from stormguard_server.drill.vllm import SKIP_OFF_REASON, build_model, engine_spec
from stormguard_server.drill.workload import build_schedule
from stormguard_server.vllm.launch import check_environment


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stormguard-drill",
        description="The OOM avalanche on the reference server: every client "
        "(openai, openai+tenacity, stormguard) x every server (admission off, on) under "
        "the same seeded workload. Traffic goes to 127.0.0.1 only.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
        help="pairings run at once, each on its own server; 1 keeps them from competing for CPU",
    )
    parser.add_argument(
        "--clients", default=",".join(CLIENT_NAMES), help="comma-separated subset of clients"
    )
    parser.add_argument(
        "--admission", default="off,on", help="comma-separated subset of server modes"
    )
    return parser


def _pairings(args: argparse.Namespace) -> list[tuple[ClientName, Admission]]:
    clients = [c for c in CLIENT_NAMES if c in args.clients.split(",")]
    admissions = [a for a in ADMISSIONS if a in args.admission.split(",")]
    if args.engine == "vllm" and "off" in admissions:
        print(SKIP_OFF_REASON, file=sys.stderr)
        admissions.remove("off")
    if not clients or not admissions:
        raise SystemExit("no pairing selected: check --clients and --admission")
    return [(c, a) for a in admissions for c in clients]


async def drill(
    config: DrillConfig, out: Path, pairings: list[tuple[ClientName, Admission]]
) -> dict[str, Any]:
    """The whole drill; returns the JSON document."""
    if config.engine != "vllm":
        return await _drill(config, out, pairings, EngineSpec(args=ENGINE_ARGS))
    # Without vLLM (the default .venv), say how to get it before building anything.
    check_environment()
    # The tiny model lives as long as the run: built offline once, shared by every server.
    with tempfile.TemporaryDirectory(prefix="stormguard-drill-model-") as tmp:
        print("building the tiny model ...", file=sys.stderr)
        model = await asyncio.to_thread(build_model, Path(tmp) / "tiny-llama")
        return await _drill(config, out, pairings, engine_spec(model))


def _skipped(engine: Engine) -> dict[str, str]:
    return {"admission off": SKIP_OFF_REASON} if engine == "vllm" else {}


async def _drill(
    config: DrillConfig,
    out: Path,
    pairings: list[tuple[ClientName, Admission]],
    spec: EngineSpec,
) -> dict[str, Any]:
    schedule = build_schedule(config.workload, config.seed)
    started = time.monotonic()
    host = machine()
    async with ServerFleet(out / "logs", spec) as fleet:
        print(f"calibrating for {config.calibration_s:.0f} s ...", file=sys.stderr)
        calibration = await run_calibration(fleet, config)
        print(f"capacity: {calibration.capacity_tps:.0f} completion tokens/s", file=sys.stderr)
        with tqdm(total=len(schedule) * len(pairings), unit="req", file=sys.stderr) as bar:
            runs = await run_all(fleet, config, schedule, pairings, bar.update)
    summaries = [summarize(run, config.workload, calibration.capacity_tps) for run in runs]
    return {
        "mode": config.mode,
        "seed": config.seed,
        "engine": config.engine,
        "engine_args": list(spec.args),
        # The sim's restart time; vLLM does not restart in the drill.
        "cold_start_s": COLD_START_S if config.engine == "sim" else None,
        "skipped": _skipped(config.engine),
        "concurrency": config.concurrency,
        "workload": asdict(config.workload),
        "patience": asdict(config.patience),
        "logical_requests_per_pairing": len(schedule),
        "calibration": asdict(calibration),
        "machine": {**host, "load_average_at_end": load_average()},
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
    config = preset(mode, seed=args.seed, concurrency=max(1, args.concurrency), engine=args.engine)
    out: Path = args.out or Path("bench/results") / f"drill-{mode}"
    try:
        document = asyncio.run(drill(config, out, _pairings(args)))
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        raise SystemExit(130) from None
    write_json(out / "drill.json", document)
    workload = config.workload
    plots = plot_all(document["pairings"], (workload.burst_start_s, workload.burst_end_s), out)
    (out / "table.md").write_text(markdown_table(document["pairings"]) + "\n")
    print(table(document["pairings"]))
    print(
        f"\ncapacity {document['calibration']['capacity_tps']:.0f} tok/s; "
        f"wall time {document['wall_time_s']} s"
    )
    print(f"JSON: {out / 'drill.json'}; plots: {', '.join(p.name for p in plots)}")


if __name__ == "__main__":
    main()
