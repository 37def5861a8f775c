"""Sweeps: one analysis per point of a grid or per model target, rows streamed to disk.

A `Point` is one target with its overrides, batch, sequence length, device and strategy; the
options every point shares are a `SweepSpec`. `grid` takes the product of every axis. Each
point runs `run_point` — the same pipeline as ``analyze`` — and becomes one flat row
(`COLUMNS`): the figures a sweep compares (parameters, FLOPs, peak memory, fit, time, and the
plan's first layout), or its error: a failing point is a row, never a lost sweep. Each row says
what its FLOPs and memory peak count (``flops_of``, ``peak_of``), the labels every page shows.
Fusion findings are left out of every point (a sweep compares these figures; they cost time).

Points known to be invalid are refused before any point runs (`past_context`): an ``hf:``
preset at a ``seq_len`` past the context length its config sets. They become rows with status
``refused`` and are never run. Known limitation: a model file's own limits are not known
without running its code, so they surface as that point's error.

Where points run: in this process (one worker), a local process pool (``spawn``: each worker
imports torch once and runs many points), or an existing Ray cluster (`ray` is an optional
extra, imported only then). Rows are appended to ``points.jsonl`` as they finish, so an
interrupted sweep resumes (`done_keys`) without recomputing the points that succeeded.
"""

from __future__ import annotations

import csv
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROWS_FILE = "points.jsonl"
AXES = ("target", "set", "batch", "seq_len", "device", "strategy")
FIGURES = ("status", "error", "params", "flops", "flops_of", "peak_bytes", "peak_of", "fits",
           "time_s", "mfu", "plan_layout", "plan_gpus", "plan_fits", "plan_peak_bytes",
           "plan_step_s", "plan_tokens_per_s", "plan_mfu", "plan_run_days", "plan_cost",
           "seconds")
COLUMNS = AXES + FIGURES


@dataclass(frozen=True)
class Point:
    target: str
    overrides: tuple[tuple[str, str], ...] = ()
    batch: int | None = None
    seq_len: int | None = None
    device: str | None = None
    strategy: str | None = None

    def key(self) -> str:
        """The point as canonical text: what a resumed sweep matches rows by."""
        return json.dumps(asdict(self), sort_keys=True)

    def axes(self) -> dict[str, Any]:
        return {"target": self.target,
                "set": ";".join(f"{k}={v}" for k, v in self.overrides),
                "batch": self.batch, "seq_len": self.seq_len, "device": self.device,
                "strategy": self.strategy}


@dataclass(frozen=True)
class SweepSpec:
    """The options every point shares (`fxlens.pipeline.AnalysisOptions` names)."""

    train: bool = False
    plan: bool = False
    gpus: int | None = None
    search: bool = False
    max_gpus: int | None = None
    micro_batches: int = 1
    precision: str | None = None
    optimizer: str = "adamw"
    loss_dtype: str = "fp32"
    mtp: int = 0
    mtp_shared: bool = False
    lora: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_base: str | None = None
    packed: int = 0
    checkpoint: bool = False
    tokens: int | None = None
    price: float | None = None
    entry: str | None = None

    def options(self, point: Point) -> Any:
        """The `fxlens.pipeline.AnalysisOptions` of `point` (imports torch)."""
        from fxlens.pipeline import AnalysisOptions

        return AnalysisOptions(
            entry=self.entry, overrides=dict(point.overrides),
            sizes={"batch": point.batch, "seq_len": point.seq_len},
            train=self.train or self.plan, plan=self.plan, gpus=self.gpus, search=self.search,
            max_gpus=self.max_gpus, micro_batches=self.micro_batches,
            precision=self.precision, optimizer=self.optimizer, loss_dtype=self.loss_dtype,
            mtp=self.mtp, mtp_shared=self.mtp_shared, lora=self.lora,
            lora_targets=self.lora_targets, lora_base=self.lora_base, packed=self.packed,
            checkpoint=self.checkpoint,
            tokens=self.tokens, price=self.price, device=point.device,
            strategy=point.strategy, fusion=False)


def grid(targets: Sequence[str], sets: Mapping[str, Sequence[str]] | None = None,
         batches: Sequence[int | None] = (None,), seq_lens: Sequence[int | None] = (None,),
         devices: Sequence[str | None] = (None,), strategies: Sequence[str | None] = (None,)
         ) -> list[Point]:
    """Every combination, targets outermost, in the order given."""
    sets = sets or {}
    names = list(sets)
    values = list(itertools.product(*(sets[n] for n in names)))
    return [Point(target, tuple(zip(names, combo, strict=True)), batch, seq, device, strategy)
            for target in targets for combo in values for batch in batches for seq in seq_lens
            for device in devices for strategy in strategies]


@dataclass(frozen=True)
class PastContext:
    """A point whose ``seq_len`` is past its model's context length: `limit` positions, set by
    the config key `key`."""

    point: Point
    limit: int
    key: str

    def reason(self) -> str:
        return (f"seq_len {self.point.seq_len} is past {self.point.target}'s context length "
                f"{self.limit} ({self.key}); lower --seq-len or raise it with "
                f"--set {self.key}=N")


def past_context(points: Sequence[Point]) -> list[PastContext]:
    """The points of ``hf:`` presets whose ``seq_len`` is past the context length the config,
    with the point's overrides, sets: what loading each would refuse, found by building only
    the configs (once per preset and overrides), before any point runs. A config that does not
    build is left to its points, whose rows then say why."""
    from fxlens.analyzer.capture.hf import context_limit
    from fxlens.analyzer.core.errors import LoadError

    limits: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, str] | None] = {}
    found = []
    for point in points:
        if not point.target.startswith("hf:") or point.seq_len is None:
            continue
        model = (point.target, point.overrides)
        if model not in limits:
            try:
                limits[model] = context_limit(point.target[3:], dict(point.overrides))
            except LoadError:
                limits[model] = None
        limit = limits[model]
        if limit is not None and point.seq_len > limit[0]:
            found.append(PastContext(point, *limit))
    return found


def refused_row(point: Point, reason: str) -> dict[str, Any]:
    """The row of a point refused before running."""
    return {**point.axes(), **dict.fromkeys(FIGURES), "status": "refused", "error": reason,
            "seconds": 0.0}


def run_point(point: Point, spec: SweepSpec) -> dict[str, Any]:
    """One point's row; any failure is the row's error (the sweep goes on)."""
    started = time.perf_counter()
    row: dict[str, Any] = {**point.axes(), **dict.fromkeys(FIGURES)}
    try:
        from fxlens.api import analyze_target

        row.update(figures(analyze_target(point.target, spec.options(point))))
        row["status"] = "ok"
    except (Exception, SystemExit) as error:   # noqa: BLE001 - a row records any failure
        row.update(status="error", error=f"{type(error).__name__}: {error}"[:500])
    row["seconds"] = round(time.perf_counter() - started, 3)
    return row


def figures(report: Any) -> dict[str, Any]:
    """The compared figures of one report (`fxlens.analyzer.core.report.Report`)."""
    from fxlens.analyzer.core.sections import Memory, Plan, Roofline, Training

    out: dict[str, Any] = {"params": report.model.params}
    training, memory = report.get(Training), report.get(Memory)
    weights = report.model.param_bytes + report.model.buffer_bytes
    if training is not None:
        checkpointed = training.checkpointed_peak_bytes   # with --checkpoint, as the headline
        out.update(flops=training.step_flops, flops_of="training step",
                   peak_bytes=training.step_peak_bytes if checkpointed is None else checkpointed,
                   peak_of="training step peak (one device"
                           + (", checkpointed)" if checkpointed is not None else ")"))
    else:
        out.update(flops=report.totals.flops, flops_of="forward",
                   peak_bytes=weights + (memory.activation_peak_bytes if memory else 0),
                   peak_of=_forward_peak_of(memory))
    roofline = report.get(Roofline)
    if roofline is not None:
        out.update(time_s=roofline.totals.total_s, mfu=roofline.mfu,
                   fits=out["peak_bytes"] <= roofline.device.capacity_bytes)
    plan = report.get(Plan)
    if plan is not None and plan.layouts:
        first = plan.layouts[0]
        out.update(plan_layout=first.strategy, plan_gpus=first.gpus, plan_fits=first.fits,
                   plan_peak_bytes=first.memory.peak_bytes, plan_step_s=first.time.step_s,
                   plan_tokens_per_s=first.time.tokens_per_s, plan_mfu=first.time.mfu)
        if first.run is not None:
            out.update(plan_run_days=first.run.wall_s / 86400, plan_cost=first.run.cost)
    elif plan is not None:
        out.update(plan_layout="none fits", plan_fits=False)
    return out


def _forward_peak_of(memory: Any) -> str:
    """What a forward row's peak counts (`Memory.activation_peak_bytes`: the simulated eager
    peak when there is one, else the graph executor's)."""
    if memory is None:
        return "weights only"
    if memory.eager is not None and memory.eager.peak_bytes is not None:
        return "weights + activation peak (eager, simulated)"
    return "weights + activation peak (graph executor)"


def done_keys(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """Keys of the points that succeeded (failed points run again on resume)."""
    return {row["key"] for row in rows if row.get("status") == "ok" and "key" in row}


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows streamed so far; a line cut short by an interruption is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text("utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_sweep(points: Sequence[Point], spec: SweepSpec, out_dir: Path, workers: int = 1,
              ray_address: str | None = None, resume: bool = False,
              on_row: Callable[[dict[str, Any]], None] = lambda _: None,
              refused: Mapping[Point, str] | None = None) -> list[dict[str, Any]]:
    """Every point's row, in the order of `points`, streamed to ``out_dir/points.jsonl``;
    the `refused` points (with why) become rows without running."""
    refused = refused or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    stream = out_dir / ROWS_FILE
    previous = read_rows(stream) if resume else []
    finished = done_keys(previous)
    kept = {row["key"]: row for row in previous if row.get("key") in finished}
    todo = [p for p in points if p.key() not in finished]
    with stream.open("a" if resume else "w", encoding="utf-8") as sink:
        def keep(point: Point, row: dict[str, Any]) -> None:
            row["key"] = point.key()
            kept[row["key"]] = row
            sink.write(json.dumps(row, sort_keys=True) + "\n")
            sink.flush()
            on_row(row)

        for point in todo:
            if point in refused:
                keep(point, refused_row(point, refused[point]))
        for point, row in _execute([p for p in todo if p not in refused], spec, workers,
                                   ray_address):
            keep(point, row)
    return [kept[p.key()] for p in points if p.key() in kept]


def _execute(points: Sequence[Point], spec: SweepSpec, workers: int, ray_address: str | None
             ) -> Iterator[tuple[Point, dict[str, Any]]]:
    if ray_address is not None:
        yield from _on_ray(points, spec, ray_address)
    elif workers <= 1 or len(points) <= 1:
        for point in points:
            yield point, run_point(point, spec)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(run_point, p, spec): p for p in points}
            for future in as_completed(futures):
                yield futures[future], future.result()


def _on_ray(points: Sequence[Point], spec: SweepSpec, address: str
            ) -> Iterator[tuple[Point, dict[str, Any]]]:
    try:
        import ray
    except ImportError as error:
        from fxlens.analyzer.core.errors import LoadError

        raise LoadError("--ray needs Ray: pip install 'fxlens[ray]'") from error
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    try:
        remote = ray.remote(run_point)
        pending = {remote.remote(p, spec): p for p in points}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started_here:
            ray.shutdown()


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in COLUMNS})


def swept_axes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The axes whose value changes between rows (``set`` split into its keys)."""
    varying = [a for a in AXES if a != "set" and len({str(r.get(a)) for r in rows}) > 1]
    keys: dict[str, set[str]] = {}
    for row in rows:
        for pair in filter(None, str(row.get("set") or "").split(";")):
            name, _, value = pair.partition("=")
            keys.setdefault(name, set()).add(value)
    return [f"set:{k}" for k, v in keys.items() if len(v) > 1] + varying


def axis_value(row: Mapping[str, Any], axis: str) -> str:
    if axis.startswith("set:"):
        pairs = dict(p.partition("=")[::2] for p in str(row.get("set") or "").split(";") if p)
        return pairs.get(axis[4:], "")
    value = row.get(axis)
    return "" if value is None else str(value)
