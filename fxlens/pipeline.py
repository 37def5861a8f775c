"""The one pipeline: capture once, cost every op, then the analysis passes, in order.

This is where the engine (`fxlens.analyzer`) meets the op knowledge (`fxlens.rules`): the
rule registry, precision and optimizer policies, autocast's op lists, fusion and quantization
rules and device specs are handed to the rooms here. Inference and training run the same passes:

    memory (inference)  Memory           liveness of the forward + the simulated eager peak
    training            Memory, Training liveness of the joint step, states, the step peak
    KV cache            KVCache          needs token inputs; one-token forward captured once
    fusion              Findings, Fusion over the analysed graph (forward or whole step)
    quantization        Quant            over the inference forward (weights as loaded)
    roofline            Roofline         needs the graph's costs; `--fused` reads the fusion plan
    checkpoint auto     Selective…       save/recompute per op under a budget (`fxlens.ckpt_pass`)
    plan                Plan             layouts over many GPUs from the training step's units
                                         (`fxlens.plan_pass`)

Where the process may fork (the `analyze` command on two cores, `fxlens.analyzer.core.beside`),
a big graph's fusion analysis, which reads only the costed nodes, runs in a child while this
process runs the memory passes before it; the passes still see its sections in their order.

`Context` holds what passes share: the loaded model, the options, the rule registry, the
device spec (built once), and the graphs (the analysed one, the inference forward, the
one-token forward), each captured once on first use.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fxlens import checks
from fxlens.analyzer.capture.chain import METHODS, capture
from fxlens.analyzer.capture.check import check_scale, mixed_dtypes
from fxlens.analyzer.capture.hf_decode import check_servable
from fxlens.analyzer.capture.load import calibration_batches, task_metrics
from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.beside import MIN_WAIT_S, Beside, beside, result_or_none
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.heap import model_loaded, settled_heap
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.passes import Pass, run_passes
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import (
    EagerPeak,
    Findings,
    Fusion,
    Memory,
    Quant,
    Roofline,
    Training,
)
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fixes.training import training_fixes
from fxlens.analyzer.fusion.kernels import (
    FusionAnalysis,
    analyze_fusion,
    fused_report,
)
from fxlens.analyzer.memory.liveness import liveness
from fxlens.analyzer.memory.measure import EagerAlongside, MeasuredMemory, simulate_eager_memory
from fxlens.analyzer.memory.training_state import parse_bytes
from fxlens.analyzer.memory.training_step import StepSettings, training_section
from fxlens.analyzer.time.roofline import compute_seconds, roofline_section, throughput_basis
from fxlens.ckpt_pass import CheckpointPass, selective_planner
from fxlens.fit_pass import InferenceFitPass
from fxlens.kv_pass import KVCachePass
from fxlens.plan_pass import PlanPass, sharded_fix
from fxlens.prune_pass import PrunePass
from fxlens.rules import load_rules
from fxlens.rules.eager import SAME_DTYPE_OPERANDS
from fxlens.rules.fusion import fusion_rules, kinds_of
from fxlens.rules.hardware import DeviceSpec
from fxlens.rules.serving import MAX_NUM_SEQS, MAX_NUM_TOKENS
from fxlens.rules.training import Optimizer, Precision
from fxlens.serve_pass import ServePass
from fxlens.step_recording import record_training_step, step_cast

log = logging.getLogger(__name__)

PRECISIONS = tuple(p.value for p in Precision)     # what --precision accepts
OPTIMIZERS = tuple(o.value for o in Optimizer)     # what --optimizer accepts
# Fusion is analysed in a child beside the memory passes from this many nodes on (where the
# process may fork, `fxlens.analyzer.core.beside`); below it, it takes about what a fork
# does. A child is given up past this much time per node (fusion takes ~40 µs per node).
FUSION_BESIDE_MIN_NODES = 5_000
FUSION_S_PER_NODE = 1e-3


@dataclass(frozen=True)
class AnalysisOptions:
    entry: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    sizes: Mapping[str, int | None] = field(default_factory=dict)
    methods: tuple[str, ...] = METHODS
    strict: bool = False
    train: bool = False
    precision: str | None = None        # None: from the parameters' dtype
    optimizer: str = "adamw"
    loss_dtype: str = "fp32"            # "logits": a transformers LM's loss without the cast
    mtp: int = 0                        # multi-token prediction depths trained beside the LM
    mtp_shared: bool = False            # one depth's weights run `mtp` times
    lora: int = 0                       # LoRA adapters' rank (0: the model's weights trained)
    lora_targets: tuple[str, ...] = ()  # the linear layers they adapt (none: all but the head)
    lora_base: str | None = None        # the frozen linear weights in NF4 (QLoRA) or FP8
    packed: int = 0                     # sequences packed from samples of this many tokens
    device_memory: str | None = None    # "80GiB" or a GPU name ("h100")
    checkpoint: bool = False            # every repeated block (the what-if)
    checkpoint_auto: bool = False       # selective, under a budget (fxlens.ckpt_pass)
    checkpoint_budget: str | None = None   # its budget; default --device-mem, --device
    checkpoint_granularity: str = "op"  # its decisions: "op" (saved ops) or "module" (wrapped)
    kv_cache: bool = False
    context: int | None = None          # KV cache context; None: the captured sequence length
    serve: bool = False                 # serving estimate (needs device): TTFT, TPOT, capacity
    input_len: int = 2048               # --serve: prompt tokens per request
    output_len: int = 256               # --serve: generated tokens per request
    serve_batches: tuple[int, ...] = ()  # --serve: batches to estimate; (): up to the capacity
    tpot_slo_s: float | None = None     # --serve: the time-per-output-token target
    kv_dtype: str | None = None         # --serve: the KV cache's dtype; None: the model's
    tp: int = 1                         # --serve: GPUs of the tensor-parallel group
    max_num_tokens: int = MAX_NUM_TOKENS  # --serve: the in-flight batcher's tokens per step
    max_num_seqs: int = MAX_NUM_SEQS    # --serve: the in-flight batcher's requests in flight
    attention_dp: bool = False          # --serve: attention data-parallel over the tp GPUs
    device: str | None = None           # roofline device ("h100", "cpu"); None: no roofline
    devices_file: str | None = None     # user JSON adding or overriding devices
    profile: str | None = None          # calibrated profile JSON (`analyze calibrate`)
    tf32: bool = False                  # fp32 matmuls may use TF32
    attention_kernel: str | None = None # "cudnn" or "flash2"; None: the device's (cuDNN's)
    fused: bool = False                 # roofline over the predicted fused kernels
    fusion: bool = True                 # fusion findings and the fused-kernel model
    quant: bool = False                 # data-free quantization sensitivity per layer
    calibrate: bool = False             # + real forwards: output SQNR per layer (implies quant)
    activations: bool = False           # calibrated runs also fake-quantize layer inputs
    calibrate_metric: str = "auto"      # calibrated ranking: auto (KL for logits)|sqnr|kl|agreement
    quant_plan: str | None = None       # "w8a8", "w4a16" or "auto" (implies quant)
    budget: str | None = None           # weight memory budget of the plan ("4GiB")
    group_size: int = 128               # int4 group size
    quant_tolerance: float | None = None  # evaluate(): relative worsening allowed (rules' default)
    allow_large: bool = False           # capture a model however long the estimate says
    plan: bool = False                  # layouts over many GPUs (implies train)
    strategy: str | None = None         # "fsdp", "dp=2,tp=4,pp=2,zero=1,sp"; None: search
    gpus: int | None = None             # GPUs of the layout (or of the search)
    search: bool = False                # search layouts up to max_gpus
    max_gpus: int | None = None
    micro_batches: int = 1
    global_batch: int | None = None     # samples per step a search holds fixed
    tokens: int | None = None           # a whole run: GPU-hours, days, cost
    price: float | None = None          # per GPU-hour
    prune: bool = False                 # coupled groups and what a unit saves (fxlens.prune_pass)
    prune_target: str | None = None     # "30%" of params, "30%flops": a plan (implies prune)
    prune_save: str | None = None       # write the planned pruned module here (torch.save)


@dataclass
class Context:
    """What the passes of one run share; graphs are captured once, on first use."""

    loaded: LoadedModel
    options: AnalysisOptions
    on_step: Callable[[str], None]
    registry: CostRegistry = field(default_factory=load_rules)
    device: DeviceSpec | None = None               # given (validate) or from the options
    step: TrainingGraph | None = None
    graphs: dict[str, Graph] = field(default_factory=dict)
    fusion: FusionAnalysis | None = None
    eager: MeasuredMemory | None = None            # the eager forward simulated by capture
    fusion_beside: Beside | None = None            # the fusion analysis started in a child
    on_costed: Callable[[Report], None] | None = None   # told the costed report, passes to come
    checkpoint_problem: Any = None     # the selective checkpointer's, built once (fxlens.ckpt_pass)

    def forward(self) -> Graph:
        """The inference forward on the example inputs; for an inference report, the eager
        memory simulation rides along the capture's fake forward when it runs one."""
        if "forward" not in self.graphs:
            ride = None if self.options.train else EagerAlongside()
            graph = capture(self.loaded.module, self.loaded.inputs, self.registry,
                            self.options.methods, self.on_step, ride)
            self.eager = ride.result if ride is not None else None
            mixed_dtypes(graph, SAME_DTYPE_OPERANDS)
            self.graphs["forward"] = graph
        return self.graphs["forward"]

    def analysed(self) -> Graph:
        """The graph the report costs: the training step's, else the forward."""
        return self.step.graph if self.step is not None else self.forward()

    def targets_gpu(self) -> bool:
        """Whether the step is run as on a GPU (the default): attention with dropout fused,
        CUDA's autocast lists, torch.optim's multi-tensor step. Not for a CPU device."""
        spec = self.device_spec()
        return spec is None or spec.kind != "cpu"

    def device_spec(self) -> DeviceSpec | None:
        if self.device is None and self.options.device is not None:
            self.device = resolve_device(self.options.device, self.options.devices_file,
                                         self.options.profile)
            if self.options.attention_kernel:
                self.device = self.device.with_attention(self.options.attention_kernel)
        return self.device


# --- passes ------------------------------------------------------------------------------------


class InferenceMemory:
    name = "memory"
    provides: tuple[type[Section], ...] = (Memory,)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return not options.train

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        ctx.on_step("simulating the eager forward's memory on fake tensors")
        profile = liveness(ctx.forward(), ctx.registry)
        return (profile.to_section(eager=_eager_peak(ctx.loaded, ctx.eager)),)


class TrainingStep:
    name = "training"
    provides: tuple[type[Section], ...] = (Memory, Training)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return bool(options.train)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        assert ctx.step is not None, "the pipeline captures the step before the passes"
        options = ctx.options
        memory = liveness(ctx.step.graph, ctx.registry, saved=ctx.step.saved)
        precision = checks.precision_of(options.precision, ctx.loaded.module)
        device_name, device_bytes = checks.device_memory(options.device_memory,
                                                           options.devices_file)
        spec = ctx.device_spec()
        if device_bytes is None and spec is not None:     # --device h100 implies its memory
            device_name, device_bytes = spec.name, spec.usable_bytes
        settings = StepSettings(
            precision_name=precision.value, precision=precision.spec,
            optimizer_name=options.optimizer, optimizer=checks.optimizer(options.optimizer).spec,
            batch=throughput_basis(ctx.step.graph).samples, device_name=device_name,
            device_bytes=device_bytes, checkpoint=options.checkpoint,
            foreach=ctx.targets_gpu(),   # torch.optim's default on a GPU, not on a CPU
            loss_dtype=options.loss_dtype, mtp=options.mtp, mtp_shared=options.mtp_shared,
            lora=options.lora, lora_base=options.lora_base, packed=options.packed,
        )
        training = training_section(ctx.step, report, memory, ctx.registry, settings)
        # one GPU's fixes; with --plan the plan's layouts are the answer (and the fix finder's
        # selective solves on a big MoE step take minutes)
        if training.fit is not None and not training.fit.fits and not options.plan:
            ctx.on_step("re-estimating the changes that would make the step fit")
            alternatives = checks.fix_alternatives(settings.precision_name,
                                                   settings.optimizer_name)
            planner = selective_planner(ctx, report, training, device_name)
            fixes = training_fixes(ctx.step, report, memory, ctx.registry, settings,
                                   alternatives, resizable="batch" in ctx.loaded.resizable,
                                   planner=planner)
            if not fixes:
                sharded = sharded_fix(ctx, report, training, device_name)
                fixes = (sharded,) if sharded is not None else ()
            training = dataclasses.replace(
                training, fit=dataclasses.replace(training.fit, fixes=fixes))
        return memory.to_section(), training


class FusionPass:
    name = "fusion"
    provides: tuple[type[Section], ...] = (Findings, Fusion)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return bool(options.fusion)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        ctx.on_step("finding fusion opportunities")
        graph = ctx.analysed()
        started, ctx.fusion_beside = ctx.fusion_beside, None
        ctx.fusion = result_or_none(started, "the fusion analysis",
                                    max(MIN_WAIT_S, len(graph.nodes) * FUSION_S_PER_NODE))
        if ctx.fusion is None:
            ctx.fusion = fusion_analysis(ctx, report)
        else:
            log.info("the fusion analysis made beside the memory passes is used")
        return ctx.fusion.sections()


def fusion_analysis(ctx: Context, report: Report) -> FusionAnalysis:
    """The kernels and findings of the analysed graph; reads the report's costed nodes only,
    so the costed report gives what the report after the memory passes gives."""
    graph = ctx.analysed()
    spec = ctx.device_spec()
    return analyze_fusion(report, graph, kinds_of(list(graph.nodes), ctx.registry),
                          fusion_rules(ctx.registry), ctx.registry.lookup,
                          spec.achievable_bandwidth if spec is not None else None,
                          compute_seconds(report, graph, spec, ctx.options.tf32)
                          if spec is not None else None)


class QuantPass:
    name = "quantization"
    provides: tuple[type[Section], ...] = (Quant,)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return bool(options.quant or options.calibrate or options.quant_plan)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        from fxlens.analyzer.quant.section import QuantSettings, quant_section
        from fxlens.rules.quant import knowledge, plan_request

        options, loaded = ctx.options, ctx.loaded
        try:
            budget = parse_bytes(options.budget) if options.budget else None
            plan = (plan_request(options.quant_plan, budget, options.group_size)
                    if options.quant_plan else None)
        except ValueError as error:
            raise LoadError(f"--quant-plan/--budget: {error}") from None
        batches, source = None, ""
        if options.calibrate:
            source = "calibration()" if loaded.calibration else "example inputs"
            batches = calibration_batches(loaded)
        settings = QuantSettings(calibration=batches, calibration_source=source,
                                 activations=options.activations,
                                 metric=options.calibrate_metric, plan=plan,
                                 evaluate=task_metrics(loaded),
                                 task_tolerance=options.quant_tolerance,
                                 example_inputs=loaded.inputs)   # data-free Fisher
        return (quant_section(loaded.module, ctx.forward(),
                              knowledge(options.group_size, ctx.registry), settings,
                              ctx.on_step),)


class RooflinePass:
    name = "roofline"
    provides: tuple[type[Section], ...] = (Roofline,)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return options.device is not None

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        spec = ctx.device_spec()
        assert spec is not None
        basis = report
        if ctx.options.fused:
            if ctx.fusion is None:
                raise LoadError("--fused needs the fusion analysis, which was turned off")
            basis = fused_report(report, ctx.fusion.plan)
        return (roofline_section(basis, ctx.analysed(), spec, ctx.options.tf32),)


PASSES: tuple[Pass[Context], ...] = (InferenceMemory(), TrainingStep(), CheckpointPass(),
                                     KVCachePass(), FusionPass(), QuantPass(), RooflinePass(),
                                     InferenceFitPass(), PlanPass(), ServePass(),
                                     PrunePass())


def run_pipeline(loaded: LoadedModel, options: AnalysisOptions,
                 on_step: Callable[[str], None] = lambda _: None,
                 device: DeviceSpec | None = None,
                 on_costed: Callable[[Report], None] | None = None) -> Report:
    """Capture `loaded` once (a training step with ``options.train``), cost every op, then
    run every pass the options ask for; `on_costed` is given the report with its ops costed
    before the passes run (the CLI starts the graph layouts its pages will need)."""
    return run_context(Context(loaded, options, on_step, device=device, on_costed=on_costed))


def run_context(ctx: Context) -> Report:
    """`run_pipeline` on a prepared context, whose graphs the caller may read afterwards."""
    with settled_heap() as settle:   # the collector skips what the analysis keeps alive
        model_loaded()
        return _run_context(ctx, settle)


def _run_context(ctx: Context, settle: Callable[[], None]) -> Report:
    loaded, options, on_step = ctx.loaded, ctx.options, ctx.on_step
    # A device given as a spec (validate's calibrated profile) is not looked up by its name.
    check_options(options if ctx.device is None else replace(options, device=None))
    ctx.device_spec()   # a bad --device fails before the capture, not after
    check_scale(loaded.module, loaded.name, options.allow_large)
    if options.serve:   # a model --serve cannot serve says so before the capture, not after
        check_servable(loaded.module)
        if options.attention_dp:
            checks.check_experts_to_split(loaded.module, options.tp)
    if options.train:
        precision, cast = step_cast(ctx)
        ctx.step = record_training_step(ctx, loaded.module, on_step)
        try:
            mixed_dtypes(ctx.step.graph, SAME_DTYPE_OPERANDS)
        except LoadError as error:
            if options.precision is None:
                raise
            how = ("under torch.autocast" if precision.spec.autocast_dtype else
                   f"with every weight cast to {cast}")
            raise LoadError(f"{error}; the step is recorded {how} "
                            f"(--precision {options.precision}): leave --precision out to "
                            f"record the model's own dtypes") from None
    graph = ctx.analysed()
    settle()
    on_step("costing the step" if options.train else "costing ops")
    report = analyze(graph, ctx.registry, loaded.name, loaded.source, options.strict)
    report = dataclasses.replace(report, model=dataclasses.replace(
        report.model, resizable=tuple(sorted(loaded.resizable))))
    early = FusionPass().wanted(options) and len(graph.nodes) >= FUSION_BESIDE_MIN_NODES
    with beside(functools.partial(fusion_analysis, ctx, report) if early
                else None) as ctx.fusion_beside:
        if ctx.on_costed is not None:
            ctx.on_costed(report)
        return run_passes(PASSES, ctx, options, report)


# --- options ----------------------------------------------------------------------------------


def check_options(options: AnalysisOptions) -> None:
    """Every option checkable without the model (`fxlens.checks.check_options`), and the
    capture methods, before anything is loaded or captured."""
    unknown = [m for m in options.methods if m not in METHODS]
    if unknown or not options.methods:
        raise LoadError(f"--method: unknown {', '.join(unknown) or '(none given)'}; known: "
                        f"{', '.join(METHODS)}")
    checks.check_options(options)


# --- helpers -----------------------------------------------------------------------------------


def _eager_peak(loaded: LoadedModel, simulated: MeasuredMemory | None) -> EagerPeak:
    """The activation peak of eager PyTorch, Python's references included, from a forward
    simulated on fake tensors (`simulated` when the capture ran it already); graph liveness
    gives the peak of a graph executor instead."""
    try:
        if simulated is None:
            simulated = simulate_eager_memory(loaded.module, loaded.inputs)
    except Exception as error:  # an extra figure: the report stands without it, and says why
        log.warning("eager memory simulation failed: %s", error)
        return EagerPeak(peak_bytes=None, error=f"{type(error).__name__}: {error}"[:300])
    return EagerPeak(peak_bytes=simulated.peak_bytes, peak_op=simulated.peak_op)


def resolve_device(name: str, devices_file: str | None = None, profile: str | None = None
                   ) -> DeviceSpec:
    """`fxlens.rules.device_files.device_spec`, its errors as one-line `LoadError`s."""
    return checks.resolve_device(name, devices_file, profile)
