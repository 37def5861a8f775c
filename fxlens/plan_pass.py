"""The plan pass: layouts over many GPUs, from the training step cut into units.

`plan_facts` reads the captured step as `fxlens.analyzer.plan.structure` needs it (each op's
time on the device, fused or fp8 where the options say so; each parameter's states; the
step's whole-step figures); `PlanPass` parses the strategy, checks it against the model and
hands both to the planner (`fxlens.analyzer.plan.search`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fxlens import checks
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import dtype_bytes
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import FixOption, Plan, Training
from fxlens.analyzer.fusion.kernels import effective_kinds, fused_report
from fxlens.analyzer.fusion.types import FUSABLE, OpKind
from fxlens.analyzer.memory.training_state import param_state
from fxlens.analyzer.time.roofline import (
    dominant_key,
    node_times,
    optimizer_time,
    throughput_basis,
)
from fxlens.rules.fusion import kinds_of
from fxlens.rules.hardware import LINK_EFFICIENCY, DeviceSpec
from fxlens.rules.training import Precision

if TYPE_CHECKING:
    from fxlens.analyzer.plan.structure import ModelFacts
    from fxlens.pipeline import AnalysisOptions, Context


class PlanPass:
    """Layouts over many GPUs, from the training step cut into units (`read_facts`)."""

    name = "plan"
    provides: tuple[type[Section], ...] = (Plan,)
    needs: tuple[type[Section], ...] = (Training,)

    def wanted(self, options: Any) -> bool:
        return bool(options.plan)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        from fxlens.analyzer.plan.search import PlanRequest, misfits, plan_section
        from fxlens.analyzer.plan.strategy import parse as parse_strategy

        assert ctx.step is not None, "a plan is made from the training step"
        ctx.on_step("laying the step out over GPUs")
        options = ctx.options
        spec = ctx.device_spec() or checks.resolve_device(checks.PLAN_DEVICE, options.devices_file,
                                                   None).with_attention(
                                                       options.attention_kernel or "")
        _, budget = checks.device_memory(options.device_memory, options.devices_file)
        if budget is not None and budget != spec.usable_bytes:   # --device-mem: every GPU's
            spec = spec.with_usable(budget)                      # budget, as for one GPU
        facts = plan_facts(ctx, report, spec)
        try:
            strategy = (parse_strategy(options.strategy, options.gpus, options.micro_batches)
                        if options.strategy else None)
        except ValueError as error:
            raise LoadError(f"--strategy: {error}") from None
        problems = misfits(facts, strategy) if strategy is not None else []
        if problems:
            raise LoadError(f"--strategy {options.strategy}: {'; '.join(problems)}")
        request = PlanRequest(strategy=strategy, gpus=None if options.search else options.gpus,
                              max_gpus=options.max_gpus or options.gpus,
                              global_batch=options.global_batch, tokens=options.tokens,
                              price_per_gpu_hour=options.price)
        assumptions = plan_assumptions(options, spec, facts)
        return (plan_section(facts, request, spec, assumptions, LINK_EFFICIENCY,
                             spec.link_source, spec.intra_node_bytes_per_s,
                             spec.inter_node_bytes_per_s),)


def plan_facts(ctx: Context, report: Report, spec: DeviceSpec) -> ModelFacts:
    """The training step as units a layout partitions (`fxlens.analyzer.plan.structure`)."""
    from fxlens.analyzer.plan.fp8 import fp8_gemms, scaling_s
    from fxlens.analyzer.plan.routing import routing_groups
    from fxlens.analyzer.plan.structure import WholeStep, read_facts
    from fxlens.analyzer.plan.tensor_split import weight_param
    from fxlens.analyzer.plan.workload import FusedOps
    from fxlens.rules.parallel import PARALLEL

    assert ctx.step is not None
    options, graph = ctx.options, ctx.step.graph
    training = report.require(Training)
    precision = checks.precision_of(options.precision, ctx.loaded.module)
    optimizer = checks.optimizer(options.optimizer)
    state_of = {p.name: param_state(p, precision.spec, optimizer.spec) for p in graph.params}
    times = node_times(report, graph, spec, options.tf32)
    key = dominant_key(report, {t.id: t for t in times})
    # --fused: each predicted kernel timed once, at its first op (the others cost nothing)
    timed = fused_report(report, ctx.fusion.plan) if options.fused and ctx.fusion else report
    weight_gemms: frozenset[int] = frozenset()   # fp8 GEMMs that read a weight
    grouped: dict[int, float] = {}               # fp8 scaling seconds of grouped GEMMs
    if precision is Precision.FP8:   # the blocks' GEMMs at the fp8 peak, plus their scaling
        gemms = PARALLEL.gemm_ops | PARALLEL.grouped_gemm_ops
        fp8 = fp8_gemms(graph, gemms)
        weight_gemms = frozenset(
            i for i in fp8 if any(weight_param(graph, r, PARALLEL) is not None
                                  for r in graph.nodes[i].input_refs()))
        times = node_times(timed, graph, spec, options.tf32, dict.fromkeys(fp8, "fp8"))
        scaling = scaling_s(graph, weight_gemms,
                            lambda r: weight_param(graph, r, PARALLEL) is not None,
                            spec.achievable_bandwidth)
        # a grouped GEMM's share is re-sized per GPU with its routed rows (`ExpertGemm`)
        grouped = {i: scaling.pop(i) for i in list(scaling)
                   if graph.nodes[i].packet in PARALLEL.grouped_gemm_ops}
        times = [dataclasses.replace(t, time_s=t.time_s + scaling[t.id],
                                     memory_s=t.memory_s + scaling[t.id])
                 if t.id in scaling else t for t in times]
    elif timed is not report:
        times = node_times(timed, graph, spec, options.tf32)
    by_id = {t.id: t for t in times}
    basis = throughput_basis(graph)
    breakdown = training.peak_breakdown
    whole = WholeStep(
        moments=breakdown.moments,
        optimizer_temporaries_bytes=max(breakdown.optimizer_phase_bytes
                                        - training.states.grad_bytes, 0),
        optimizer_s=optimizer_time(training, graph, spec),
        samples=basis.samples, tokens=basis.tokens, dtype_key=key,
        peak_flops=spec.peak(key)[0],
        grad_element_bytes=dtype_bytes(precision.spec.grad_dtype),
    )
    fusion = None
    if options.fused:   # saved as fused kernels keep them (`fused_saved`)
        kinds = effective_kinds(report, kinds_of(list(graph.nodes), ctx.registry))
        fusion = FusedOps(
            cheap=frozenset(i for i, k in kinds.items() if k in FUSABLE or k is OpKind.FREE),
            gemms=frozenset(i for i, k in kinds.items() if k is OpKind.GEMM),
            fp8_gemms=weight_gemms)
    config = getattr(ctx.loaded.module, "config", None)
    # the host launches the captured program's kernels, fused or not (`plan.host`)
    launched = frozenset(n.id for n in report.nodes if n.status == "costed")
    recurrences = {n.id: n.recurrence for n in report.nodes if n.recurrence is not None}
    return read_facts(ctx.step, report, ctx.registry, state_of,
                      by_id, PARALLEL, whole, fusion, routing_groups(config), grouped,
                      launched, recurrences, spec.multiprocessors)


def plan_assumptions(options: AnalysisOptions, spec: DeviceSpec, facts: ModelFacts
                      ) -> tuple[str, ...]:
    device = (f"device {spec.name}" + ("" if options.device else
                                        " (the default; --device to choose)")
              + (f"; attention on {ATTENTION_NAMES[options.attention_kernel]}"
                 if options.attention_kernel else ""))
    batch = (f"the captured batch ({facts.samples} samples"
             + (f", {facts.tokens} tokens" if facts.tokens else "") + ") is one micro-batch")
    return (
        device, batch,
        ("--fused: each predicted fused kernel timed once; activations saved as fused "
         "kernels keep them (GEMM inputs kept, pointwise and norm intermediates recomputed"
         + ("; a weight GEMM's activation input kept as its fp8 copy"
            if options.precision == Precision.FP8.value else "") + ")"
         if options.fused else "ops timed and activations saved as the captured (eager) "
         "program runs them; --fused for fused kernels (Transformer Engine, torch.compile)"),
        f"collectives: ring algorithms at {LINK_EFFICIENCY:.0%} of the link bandwidth after "
        "a per-call latency (NCCL's model: a base and a hop per ring step); congestion not "
        "modelled",
        "gradient and ZeRO transfers overlap compute (DDP/ZeRO-1/2: the last micro-batch's "
        "backward; ZeRO-3: all of it), ring-attention sends their attention (cp_comm=a2a "
        "and allgather exchanges do not), expert all-to-alls the compute of another "
        "micro-batch's layer they are paired with only with a2a-overlap (not in the "
        "pipeline's warm-up and cool-down), "
        "tensor-parallel transfers their GEMMs only with tp-overlap; pipeline transfers "
        "do not",
        "1F1B pipeline: bubble (p − 1)/v micro-batch times; stage i holds min(m, p − i) "
        "micro-batches of activations (interleaved, v > 1: Megatron's warm-up chunks)",
        "ranks laid out tp innermost, then cp, dp, pp outermost; experts over a stage's GPUs "
        "as etp, ep, expert dp",
        f"a micro-batch takes no less than the host launching its kernels: the captured "
        f"program's, {spec.framework_launch_s * 1e6:.1f} µs each (a Python training "
        "framework's, DeepSeek-V3's published trace), a recomputed forward's again; none "
        "under graphs (CUDA graphs), fewer under graphs=attn+…",
    ) + ((FP8_ASSUMPTION,) if options.precision == Precision.FP8.value else ()) + (
        (_routing_assumption(facts),) if facts.experts else ()) + (
        ("--tokens: the inputs hold no (batch, sequence) token tensor, so no run is "
         "estimated",) if options.tokens and not facts.tokens else ())


ATTENTION_NAMES = {"cudnn": "cuDNN's fused kernel", "flash2": "FlashAttention-2"}
FP8_ASSUMPTION = ("fp8: the repeated blocks' GEMMs at the fp8 peak, each weight GEMM's "
                  "activation operand (forward) and output gradient (backward) quantized "
                  "in a pass of its own; GEMMs outside the blocks (the LM head) in bf16, as "
                  "Megatron-core and torchtitan run them")


def _routing_assumption(facts: ModelFacts) -> str:
    routing = facts.routing
    groups = (f" within {routing.groups_per_token} of {routing.groups} expert groups "
              "(the model's group-limited routing)" if routing.limited else "")
    return ("expert routing balanced (each expert gets the same rows; a token's experts drawn "
            f"uniformly{groups}, or k consecutive ones with routing=blocks); a token goes once "
            "per chosen expert inside a node (dispatch=alltoall), once per node holding any of "
            "its experts across nodes (DeepEP, dispatch=deepep); not modelled: load beyond "
            "balanced, and a dropless dispatcher's wait for its token counts")


FIX_GPUS_MAX = 1024     # the most GPUs a sharding fix looks at


def sharded_fix(ctx: Context, report: Report, training: Training, device_name: str
                ) -> FixOption | None:
    """A step whose weights, gradients and optimizer state outgrow one `device_name`: the
    fewest GPUs (a power of two, from the count the state alone needs) over which the planner
    finds a layout that fits, as the flags that show it (``--plan --gpus N``, with
    ``--device`` where the plan's device would otherwise differ). The planner's estimate is
    the re-estimate; None when the device has no link figures to plan with or nothing fits."""
    from fxlens.analyzer.plan.search import PlanRequest, plan_section

    fit = training.fit
    assert fit is not None
    try:
        spec = checks.resolve_device(device_name, ctx.options.devices_file, None)
    except LoadError:
        return None      # a size (--device-mem 80GiB), not a GPU: no links to plan with
    if spec.inter_node_bytes_per_s <= 0 or spec.usable_bytes != fit.device_bytes:
        return None
    facts = plan_facts(ctx, report.with_(training), spec)
    state = training.state_bytes
    gpus = 2 ** max(math.ceil(math.log2(max(state / fit.device_bytes, 2))), 1)
    while gpus <= FIX_GPUS_MAX:
        plan = plan_section(facts, PlanRequest(gpus=gpus), spec, (), LINK_EFFICIENCY,
                            spec.link_source, spec.intra_node_bytes_per_s,
                            spec.inter_node_bytes_per_s)
        layout = next((layout for layout in plan.layouts if layout.fits), None)
        if layout is not None:
            planned = ctx.options.device or checks.PLAN_DEVICE   # what --plan lays out on
            device = "" if planned.lower() == spec.name.lower() else f" --device {spec.name}"
            return FixOption(flags=f"--plan --gpus {gpus}{device}",
                             needed_bytes=layout.memory.peak_bytes, recompute_overhead=0.0,
                             change=f"{layout.strategy} on {gpus}× {spec.name}")
        gpus *= 2
    return None
