"""Options checked before anything is loaded or captured: one clear error in a second, never
after a long analysis, and never a nonsense report from a nonsense option.

`check_options(options)` takes an `fxlens.pipeline.AnalysisOptions` or anything with its
attribute names (the CLI checks its arguments before it imports torch, which the pipeline
needs). It joins engine and hardware knowledge like `fxlens.pipeline`, and imports neither
torch nor the capture chain: only ``--quant-plan`` loads the quantization rules (torch).

Checked: sizes (``--batch``, ``--seq-len``, ``--image-size``), ``--context`` and
``--group-size`` at least 1; ``--precision`` and ``--optimizer`` known; ``--device-mem`` a
size above 0 or a known GPU; ``--checkpoint auto`` a training step with a budget
(``--checkpoint-budget``, ``--device-mem`` or ``--device``), ``--checkpoint-granularity`` only
with it; ``--budget`` a size above 0 and
the plan it goes with; the
``--device`` with its ``--devices`` file and ``--profile`` (each file read and validated:
finite, non-negative figures), and those files even without ``--device``, so a broken one is
never silently ignored. ``--plan``: a training step, a readable ``--strategy`` that agrees
with ``--gpus``, GPU counts, micro-batches, batch and tokens at least 1, a price of 0 or more.
``--mtp``, ``--lora`` (with ``--lora-targets``) and ``--packed``: a training step, in range.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import is_module_name
from fxlens.analyzer.memory.training_state import parse_bytes
from fxlens.analyzer.plan.strategy import parse as parse_strategy
from fxlens.rules.device_files import device_spec, load_devices
from fxlens.rules.hardware import DeviceSpec, device
from fxlens.rules.training import LOSS_DTYPES, Optimizer, Precision

if TYPE_CHECKING:   # the fix finder imports torch; this module is read before torch loads
    from fxlens.analyzer.fixes.training import Alternatives


def check_options(options: Any) -> None:
    """`LoadError` for the first option that cannot work, before any model code runs."""
    for key, value in dict(options.sizes).items():
        at_least_one(f"--{key.replace('_', '-')}", value)
    at_least_one("--context", options.context)
    at_least_one("--group-size", options.group_size)
    if options.precision is not None:
        _precision_for(options)
    optimizer(options.optimizer)
    loss = getattr(options, "loss_dtype", "fp32")
    if loss not in LOSS_DTYPES:
        raise LoadError(f"--loss-dtype {loss!r}: one of {', '.join(LOSS_DTYPES)}")
    _mtp(options)
    _lora(options)
    _packed(options)
    device_memory(options.device_memory, options.devices_file)
    if getattr(options, "checkpoint_auto", False) or getattr(options, "checkpoint_budget", None):
        checkpoint_budget(options)
    granularity = getattr(options, "checkpoint_granularity", "op")
    if granularity not in GRANULARITIES:
        raise LoadError(f"--checkpoint-granularity: {granularity!r} is not one of "
                        f"{', '.join(GRANULARITIES)}")
    if granularity != "op" and not getattr(options, "checkpoint_auto", False):
        raise LoadError("--checkpoint-granularity is what --checkpoint auto decides on: add "
                        "--train --checkpoint auto")
    if options.budget is not None or options.quant_plan:
        _plan(options.quant_plan, options.budget, options.group_size)
    if getattr(options, "prune_target", None):
        _prune_target(options.prune_target)
    if options.device is not None:
        resolve_device(options.device, options.devices_file, options.profile)
    elif options.profile is not None or options.devices_file is not None:
        resolve_device("cpu", options.devices_file, options.profile)
    if getattr(options, "attention_kernel", None) and options.device is None \
            and not options.plan:
        raise LoadError("--attention-kernel rates attention on a device: add --device "
                        "(e.g. --device h100) or --plan")
    _parallel_plan(options)
    if getattr(options, "serve", False):
        _serving(options)
    elif getattr(options, "attention_dp", False):
        raise LoadError("--attention-dp lays out serving: add --serve")


PLAN_DEVICE = "h100"     # what --plan lays out on without --device
GRANULARITIES = ("op", "module")     # what --checkpoint auto decides on


def _precision_for(options: Any) -> None:
    """A training policy, or (with --serve) a serving format too (`fxlens.rules.serving`)."""
    from fxlens.rules.serving import SERVE_ONLY, WEIGHT_ONLY

    if options.precision not in SERVE_ONLY:
        precision(options.precision)
    elif not getattr(options, "serve", False):
        kind = "weight-only serving" if options.precision in WEIGHT_ONLY else "serving"
        raise LoadError(f"--precision {options.precision} is a {kind} format: "
                        f"add --serve (training runs at "
                        f"{', '.join(p.value for p in Precision)})")


def _serving(options: Any) -> None:
    """``--serve``: a device to time on, an inference run, lengths and batches ≥ 1, a
    serving precision and KV dtype the estimate knows (`fxlens.rules.serving`)."""
    from fxlens.rules.serving import KV_DTYPE_BYTES, SERVE_PRECISIONS

    if options.device is None:
        raise LoadError("--serve times the requests on a device: add --device (h100, a100, …)")
    if options.train or options.plan:
        raise LoadError("--serve estimates inference; leave out --train and --plan")
    at_least_one("--input-len", options.input_len)
    at_least_one("--output-len", options.output_len)
    for batch in options.serve_batches:
        at_least_one("--batch", batch)
    if options.precision is not None and options.precision not in SERVE_PRECISIONS:
        raise LoadError(f"--precision {options.precision} is a training policy; serving runs "
                        f"at {', '.join(SERVE_PRECISIONS)}")
    if options.kv_dtype is not None and options.kv_dtype not in KV_DTYPE_BYTES:
        raise LoadError(f"--kv-dtype: {options.kv_dtype!r} is not one of "
                        f"{', '.join(KV_DTYPE_BYTES)}")
    if options.tpot_slo_s is not None and not options.tpot_slo_s > 0:
        raise LoadError("--tpot-slo must be a time above 0 (50ms)")
    at_least_one("--tp", options.tp)
    if options.attention_dp and options.tp < 2:
        raise LoadError("--attention-dp spreads requests over the GPUs of --tp N: add --tp 2 "
                        "or more")
    at_least_one("--max-num-tokens", options.max_num_tokens)
    at_least_one("--max-num-seqs", options.max_num_seqs)
    spec = resolve_device(options.device, options.devices_file, options.profile)
    if options.tp > spec.gpus_per_node:
        raise LoadError(f"--tp {options.tp}: a tensor-parallel group stays inside one node "
                        f"({spec.gpus_per_node} {spec.name} per node)")


def check_experts_to_split(module: Any, gpus: int) -> None:
    """``--attention-dp`` splits a MoE model's routed experts over the GPUs: refuse a model
    without them (it would be N replicas of the model), or whose experts do not split evenly
    over `gpus` (engines hold E/N whole experts on each)."""
    from fxlens.rules.serving import moe_routing

    routing = moe_routing(getattr(module, "config", None))
    if routing is None:
        raise LoadError(f"--attention-dp splits a MoE model's routed experts over the GPUs; "
                        f"{type(module).__name__} has none (serve one replica per GPU, or "
                        f"shard it with --tp alone)")
    if routing[0] % gpus:
        raise LoadError(f"--attention-dp over {gpus} GPUs: {routing[0]} routed experts do not "
                        f"split evenly over them (each GPU holds whole experts)")


def _parallel_plan(options: Any) -> None:
    for flag in ("gpus", "max_gpus", "micro_batches", "global_batch", "tokens"):
        at_least_one(f"--{flag.replace('_', '-')}", getattr(options, flag))
    asked = [f"--{flag.replace('_', '-')}" for flag in
             ("strategy", "gpus", "search", "max_gpus", "global_batch", "tokens", "price")
             if getattr(options, flag) not in (None, False)]
    if asked and not options.plan:
        raise LoadError(f"{', '.join(asked)} shape a parallel plan: add --plan")
    if options.plan and not options.train:
        raise LoadError("--plan lays out a training step: add --train")
    if options.price is not None and not options.price >= 0:
        raise LoadError(f"--price must be 0 or more per GPU-hour, got {options.price!r}")
    if options.strategy is not None and options.search:
        raise LoadError("--strategy names one layout and --search looks for the best: "
                        "give one of them")
    if options.strategy is not None:
        try:
            parse_strategy(options.strategy, options.gpus, options.micro_batches)
        except ValueError as error:
            raise LoadError(f"--strategy: {error}") from None
    if options.plan:
        spec = resolve_device(options.device or PLAN_DEVICE, options.devices_file,
                              options.profile)
        if spec.inter_node_bytes_per_s <= 0 or (spec.gpus_per_node > 1
                                                and spec.intra_node_bytes_per_s <= 0):
            raise LoadError(f"--plan: device {spec.name!r} has no link bandwidths; give its "
                            f"entry in the --devices file gpus_per_node, "
                            f"intra_node_bytes_per_s and inter_node_bytes_per_s")


MAX_MTP_DEPTHS = 16


def _mtp(options: Any) -> None:
    """``--mtp N`` trains beside a training step, N in 1 … `MAX_MTP_DEPTHS`."""
    depths, shared = getattr(options, "mtp", 0), getattr(options, "mtp_shared", False)
    if depths is None or depths == 0:
        if shared:
            raise LoadError("--mtp-shared: the depths of --mtp N share one depth's weights; "
                            "add --mtp N")
        return
    if isinstance(depths, bool) or not isinstance(depths, int) or not (
            1 <= depths <= MAX_MTP_DEPTHS):
        raise LoadError(f"--mtp {depths!r}: multi-token prediction depths, 1 to "
                        f"{MAX_MTP_DEPTHS}")
    if not options.train:
        raise LoadError("--mtp trains beside a training step: add --train (or --plan)")


MAX_LORA_RANK = 65_536
LORA_BASES = ("nf4", "fp8")     # the frozen weights' formats (fxlens.analyzer.capture.lora)


def _lora(options: Any) -> None:
    """``--lora R`` fine-tunes adapters in a training step, R in 1 … `MAX_LORA_RANK`;
    ``--lora-targets`` names their layers."""
    rank, targets = getattr(options, "lora", 0), getattr(options, "lora_targets", ())
    base = getattr(options, "lora_base", None)
    if base is not None and base not in LORA_BASES:
        raise LoadError(f"--lora-base {base!r}: one of {', '.join(LORA_BASES)}")
    if rank is None or rank == 0:
        if targets or base:
            flag = "--lora-targets: the layers" if targets else "--lora-base: the base weights"
            raise LoadError(f"{flag} --lora R fine-tunes on; add --lora R")
        return
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_LORA_RANK:
        raise LoadError(f"--lora {rank!r}: the adapters' rank, 1 to {MAX_LORA_RANK:,}")
    if not options.train:
        raise LoadError("--lora fine-tunes in a training step: add --train (or --plan)")
    bad = next((t for t in targets if not is_module_name(t)), None)
    if bad is not None:
        raise LoadError(f"--lora-targets: {bad!r} is not a layer name (names such as "
                        "q_proj,v_proj or mlp.down_proj, comma-separated)")


def _packed(options: Any) -> None:
    """``--packed L`` packs a training step's sequences from samples of L ≥ 1 tokens."""
    sample = getattr(options, "packed", 0)
    if sample is None or sample == 0:
        return
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise LoadError(f"--packed {sample!r}: the samples' length in tokens, at least 1")
    if not options.train:
        raise LoadError("--packed trains on packed sequences: add --train (or --plan)")


def at_least_one(flag: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoadError(f"{flag} must be at least 1, got {value!r}")


def precision(name: str) -> Precision:
    return _member(Precision, "precision", name)


# The precision a model is trained in when --precision is not given: its parameters' dtype.
DEFAULT_PRECISION = {"float32": "fp32", "bfloat16": "amp-bf16", "float16": "amp-fp16"}


def precision_of(name: str | None, module: Any) -> Precision:
    """`name`'s precision, or (None) the one `module`'s first floating parameter implies."""
    if name is None:
        dtype = next((str(p.dtype).removeprefix("torch.") for p in module.parameters()
                      if p.is_floating_point()), "float32")
        name = DEFAULT_PRECISION.get(dtype, "fp32")
    return precision(name)


def optimizer(name: str) -> Optimizer:
    return _member(Optimizer, "optimizer", name)


E = TypeVar("E", bound=Enum)


def _member(kind: type[E], what: str, name: str) -> E:
    try:
        return kind(name)
    except ValueError:
        known = ", ".join(str(m.value) for m in kind)
        raise LoadError(f"unknown {what} {name!r}; known: {known}") from None


def device_memory(text: str | None, devices_file: str | None = None,
                  flag: str = "--device-mem") -> tuple[str, int | None]:
    """``"80GiB"`` → ("80GiB", bytes); ``"h100"`` → its memory (a GPU of the registry or of
    the user's `devices_file`); None → no fit check."""
    if text is None:
        return "", None
    try:
        size = parse_bytes(text)
    except ValueError:
        pass
    else:
        if size <= 0:
            raise LoadError(f"{flag}: {text!r} is no memory; give a size above 0 "
                            f"(80GiB) or a GPU name (h100)")
        return text, size
    try:
        spec = device(text, load_devices(Path(devices_file)) if devices_file else None)
    except ValueError as error:
        raise LoadError(f"{flag}: {error}") from None
    return spec.name, spec.usable_bytes


def checkpoint_budget(options: Any) -> tuple[str, int]:
    """The memory budget of ``--checkpoint auto`` and where it came from: ``--checkpoint-budget
    SIZE|GPU``, else ``--device-mem``, else the ``--device``'s memory (``--budget`` is the
    quantization plan's weight budget, not this one)."""
    if not options.train or not options.checkpoint_auto:
        raise LoadError("--checkpoint-budget is the budget of --checkpoint auto, which plans "
                        "a training step: add --train --checkpoint auto")
    if options.checkpoint:
        raise LoadError("--checkpoint (every block) and --checkpoint auto (selective, under a "
                        "budget) are two answers: give one")
    for flag, text in (("--checkpoint-budget", options.checkpoint_budget),
                       ("--device-mem", options.device_memory)):
        if text is not None:
            _, size = device_memory(text, options.devices_file, flag)
            assert size is not None
            return f"{flag} {text}", size
    if options.device is not None:
        spec = resolve_device(options.device, options.devices_file, options.profile)
        if spec.usable_bytes:
            return f"{spec.name}'s usable memory (--device)", spec.usable_bytes
    raise LoadError("--checkpoint auto needs a memory budget: --checkpoint-budget 70GiB (or a "
                    "GPU name: h100), or a device to fill (--device-mem, --device)")


def resolve_device(name: str, devices_file: str | None = None, profile: str | None = None
                   ) -> DeviceSpec:
    """`fxlens.rules.device_files.device_spec`, its errors as one-line `LoadError`s."""
    try:
        return device_spec(name, devices_file, profile)
    except ValueError as error:
        raise LoadError(f"--device: {error}") from None


def _prune_target(text: str) -> None:
    from fxlens.analyzer.prune.plan import parse_target

    try:
        parse_target(text)
    except ValueError as error:
        raise LoadError(f"--prune-target: {error}") from None


def _plan(quant_plan: str | None, budget_text: str | None, group_size: int) -> None:
    try:
        budget = parse_bytes(budget_text) if budget_text is not None else None
        if budget is not None and budget <= 0:
            raise ValueError(f"the budget must be more than 0 bytes, got {budget_text}")
        if quant_plan:
            from fxlens.rules.quant import plan_request

            plan_request(quant_plan, budget, group_size)
    except ValueError as error:
        raise LoadError(f"--quant-plan/--budget: {error}") from None


def fix_alternatives(precision_name: str, optimizer_name: str) -> Alternatives:
    """What a training fix may switch to from this precision and optimizer, keeping the step
    as recorded (`fxlens.analyzer.fixes.training`): Adam(W) → its 8-bit form; amp-bf16 → pure
    bf16 (the same bf16 weights and activations)."""
    from fxlens.analyzer.fixes.training import Alternatives

    eight_bit = Optimizer.ADAM8BIT
    pure = Precision.BF16
    return Alternatives(
        eight_bit_optimizer=((eight_bit.value, eight_bit.spec) if optimizer_name in (
            Optimizer.ADAM.value, Optimizer.ADAMW.value) else None),
        pure_half_precision=((pure.value, pure.spec)
                             if precision_name == Precision.AMP_BF16.value else None))
