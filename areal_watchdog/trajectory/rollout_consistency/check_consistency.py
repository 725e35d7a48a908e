"""``areal-launch check-consistency RUN_DIR``: for dumped steps, the engine's log-prob of every
trained token beside the one ``transformers`` computes with the weights that generated it; a
table per step, the worst tokens decoded, what may explain a gap, and an SVG of the gaps.

Exit 0 when every step's mean gap is numerics (under ``consistency.LARGE_MEAN_GAP``), 1 when one
is not, 2 for bad input (no dumps, no weights, a bad range)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from areal_watchdog.common.errors import UserError
from areal_watchdog.common.interprocess.http import server_address
from areal_watchdog.common.rankset import format_ranks, parse_ranks
from areal_watchdog.config.load import load_config
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import check_run_dir
from areal_watchdog.trajectory.format import DumpError, complete_steps
from areal_watchdog.trajectory.reader import load_global_batch
from areal_watchdog.trajectory.replay.replay_plan import dump_dir
from areal_watchdog.trajectory.rollout_consistency.consistency import (
    DEFAULT_THRESHOLD,
    LARGE_MEAN_GAP,
    StepConsistency,
    compare_step,
)
from areal_watchdog.trajectory.rollout_consistency.consistency_plot import draw
from areal_watchdog.trajectory.rollout_consistency.greedy import GreedyPair, compare, dumped_prompts
from areal_watchdog.trajectory.rollout_consistency.recompute import (
    Recomputer,
    actor_path,
    group_rows,
    weights_of,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="areal-launch check-consistency",
        description="Compare the inference engine's log-probs of the dumped steps' trained "
        "tokens with transformers' (AReaL's rollout-consistency check).",
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", help="dumped steps to check, e.g. 0,2-3 (default: all)")
    parser.add_argument(
        "--weights",
        type=Path,
        help="a Hugging Face folder to score every version with (default: actor.path for "
        "version 0, the saver's checkpoint of step v-1 for version v)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"a token diverges past this gap in nats (default {DEFAULT_THRESHOLD})",
    )
    parser.add_argument(
        "--plot", type=Path, help="where to draw the plot, .svg or .png (default: in RUN_DIR)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per step")
    parser.add_argument(
        "--generate", type=int, metavar="N",
        help="also send the first N prompts of the first step greedily to --server and to "
        "transformers, and compare the tokens (AReaL's cmp_rollout.py)",
    )  # fmt: skip
    parser.add_argument("--server", help="host:port of a live inference server (--generate)")
    parser.add_argument(
        "--tokens", type=int, help="tokens each side generates (default gconfig.max_new_tokens)"
    )
    return parser


def cmd_check_consistency(argv: list[str], _watchdog: bool) -> int:
    args = _parser().parse_args(argv)
    if (args.generate is None) != (args.server is None):
        raise UserError("--generate N and --server HOST:PORT go together")
    if args.generate is not None and args.generate < 1:
        raise UserError(f"--generate {args.generate}: give a number of prompts above 0")
    if args.server is not None:
        args.server = server_address(args.server)
    run_dir = check_run_dir(args.run_dir)
    layout = RunLayout(run_dir)
    if not layout.launch_config.is_file():
        raise UserError(f"{run_dir}: not a run directory of areal-launch (no watchdog/)")
    config = load_config(layout.launch_config)
    dumps = dump_dir(config, run_dir)
    steps = _steps(args.steps, sorted(complete_steps(dumps)), dumps)
    temperature = _temperature(config.raw)
    recompute = Recomputer(
        weights_of(config.raw, args.weights), temperature, actor_path(config.raw)
    )
    limit = _context_length(config.raw)
    results = [_check(recompute, dumps, step, args.threshold, limit) for step in steps]
    plot = args.plot or run_dir / "consistency" / f"steps-{format_ranks(steps)}.svg"
    plot.parent.mkdir(parents=True, exist_ok=True)
    not_drawn = draw(results, args.threshold, plot)
    pairs = _greedy(args, config.raw, recompute, dumps, steps[0]) if args.generate else []
    if args.json:
        for result in results:
            print(json.dumps(_as_dict(result)))
        if pairs:
            print(json.dumps({"greedy": [{**asdict(p), "parts_at": p.parts_at} for p in pairs]}))
    else:
        decode = _decoder(config.raw, args.weights)
        shown = f"{plot} ({not_drawn})" if not_drawn else str(plot)
        print(_table(results, temperature, args.threshold, decode, shown, recompute.device_name))
        if pairs:
            print("\n".join(_greedy_lines(pairs, args.server, decode)))
    return 1 if any(r.mean_abs > LARGE_MEAN_GAP for r in results) else 0


def _greedy(
    args: argparse.Namespace, raw: dict[str, Any], recompute: Recomputer, dumps: Path, step: int
) -> list[GreedyPair]:
    """The first prompts of ``step`` through the server and ``transformers``, greedily, with
    the weights of the version that generated that step's first group."""
    groups = load_global_batch(dumps, step)
    first = group_rows(groups[0])[0]
    version = next((v for v, m in zip(first["versions"], first["loss_mask"], strict=False) if m), 0)
    weights = recompute.weights(version)
    if weights is None:
        raise UserError(f"--generate: no weights of version {version} here: pass --weights DIR")
    gconfig = raw.get("gconfig") if isinstance(raw.get("gconfig"), dict) else {}
    tokens = args.tokens or int(gconfig.get("max_new_tokens") or 16)
    prompts = dumped_prompts(groups, args.generate)
    fewer = f" (of {args.generate} asked: all step {step} holds)"
    fewer = "" if len(prompts) == args.generate else fewer
    print(f"[areal-launch] greedy: {len(prompts)} distinct prompts{fewer} x {tokens} tokens",
          file=sys.stderr)  # fmt: skip
    return compare(recompute, weights, args.server, prompts, tokens)


def _greedy_lines(pairs: list[GreedyPair], server: str, decode) -> list[str]:
    same = sum(p.parts_at is None for p in pairs)
    lines = ["", f"greedy generation, {server} beside transformers: {same} of {len(pairs)} "
             f"prompts identical ({len(pairs[0].engine)} tokens each)"]  # fmt: skip
    for index, pair in enumerate(pairs):
        at = pair.parts_at
        if at is None:
            continue
        before = decode(pair.prompt[-8:] + pair.engine[:at])
        engine, trainer = decode(pair.engine[at : at + 4]), decode(pair.trainer[at : at + 4])
        lines.append(
            f"  prompt {index}: parts at token {at} after {before!r}: engine {engine!r}, "
            f"transformers {trainer!r}"
        )
    return lines


def _steps(text: str | None, available: list[int], dumps: Path) -> list[int]:
    if not available:
        raise UserError(f"{dumps}: no complete trajectory dump to check")
    if text is None:
        return available
    try:
        wanted = list(parse_ranks(text))
    except ValueError:
        raise UserError(f"--steps {text}: not a list of steps (e.g. 0,2-3)") from None
    missing = [s for s in wanted if s not in available]
    if missing:
        raise UserError(
            f"--steps: no dump of step {format_ranks(missing)} in {dumps} "
            f"(dumped: {format_ranks(available)})"
        )
    return wanted


def _temperature(raw: dict[str, Any]) -> float:
    """The actor's temperature: the trainer divides its logits by it, as the engine did."""
    actor = raw.get("actor") if isinstance(raw.get("actor"), dict) else {}
    value = actor.get("temperature", 1.0)
    return float(value) if isinstance(value, (int, float)) and value > 0 else 1.0


def _context_length(raw: dict[str, Any]) -> int | None:
    """The engine's context limit, where the config says it (SGLang's or vLLM's section)."""
    for section, key in (("sglang", "context_length"), ("vllm", "max_model_len")):
        value = (raw.get(section) or {}).get(key) if isinstance(raw.get(section), dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check(
    recompute: Recomputer, dumps: Path, step: int, threshold: float, limit: int | None
) -> StepConsistency:
    try:
        groups = load_global_batch(dumps, step)
    except DumpError as exc:
        raise UserError(str(exc)) from None
    sequences, unchecked = [], 0
    for index, group in enumerate(groups):
        rows, missing = recompute.group(index, group)
        sequences += rows
        unchecked += missing
    print(f"[areal-launch] step {step}: {len(sequences)} sequences scored", file=sys.stderr)
    truncated = sum(len(s.ids) >= limit for s in sequences) if limit else 0
    return compare_step(step, sequences, threshold, unchecked, truncated)


def _decoder(raw: dict[str, Any], weights: Path | None):
    """Token ids to text with the run's tokenizer; ids as they are where none loads."""
    path = raw.get("tokenizer_path") or (raw.get("actor") or {}).get("path") or weights
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception:  # noqa: BLE001 - decoding is a courtesy: ids still say it
        return lambda ids: " ".join(map(str, ids))
    return lambda ids: tokenizer.decode(ids)


def _table(results: list[StepConsistency], temperature: float, threshold: float, decode,
           plot: str, device: str) -> str:  # fmt: skip
    lines = [
        f"rollout consistency, temperature {temperature:g}, transformers on {device} (gaps in "
        "nats)",
        "",
        f"step  tokens  mean|gap|  max|gap|  KL(k3)    >{threshold:g}",
    ]
    for r in results:
        lines.append(f"{r.step:<5} {r.tokens:<7} {r.mean_abs:<10.4f} {r.max_abs:<9.4f} "
                     f"{r.kl:<9.5f} {100 * r.over_threshold:.1f}%")  # fmt: skip
        for d in r.worst:
            before = decode(d.ids[max(0, d.position - 12) : d.position])
            lines.append(
                f"  worst: group {d.group} sample {d.sample}, token {d.position} "
                f"{decode([d.token])!r} after {before!r}: engine {d.engine:.3f}, "
                f"transformers {d.trainer:.3f} (gap {d.gap:.3f})"
            )
        lines += [f"  flag: {flag}" for flag in r.flags]
    lines += ["", f"plot: {plot}"]
    return "\n".join(lines)


def _as_dict(result: StepConsistency) -> dict[str, Any]:
    data = {k: v for k, v in result.__dict__.items() if k not in ("gaps", "worst")}
    data["worst"] = [{k: v for k, v in d.__dict__.items() if k != "ids"} for d in result.worst]
    return data
