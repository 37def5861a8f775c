"""How a training step is laid out over GPUs: one `Strategy`, parsed from the text users type.

Degrees: ``dp`` data parallel, ``tp`` tensor parallel (Megatron column/row split), ``pp``
pipeline stages, ``cp`` context parallel (the sequence split over cp GPUs, attention by ring
exchange of K/V), ``ep`` expert parallel and ``etp`` expert tensor parallel. GPUs =
dp · tp · pp · cp. Experts are laid out as Megatron-core folds them (Liu et al. 2025, "MoE
parallel folding"): the GPUs of one pipeline stage, tp · cp · dp of them, are regrouped as
etp · ep · edp for the expert layers, so ep · etp must divide tp · cp · dp; ``etp`` defaults to
tp without expert parallelism (each expert split like a dense MLP) and to 1 with it (each
expert whole on one GPU, as published MoE recipes set it).

``zero`` is the ZeRO stage (0: DDP; 1: Megatron's distributed optimizer; 3: FSDP full shard),
over the GPUs holding the same weights (dp · cp); ``hybrid`` shards ZeRO-3 inside a node and
replicates across nodes (FSDP's HYBRID_SHARD); ``sp`` sequence parallel (with tp); ``ckpt``
activation recomputation of every repeated block (``ckpt`` or ``ckpt=full``), of some of
its modules (``ckpt=norm+act``, ``ckpt=core_attn``, ``ckpt=self_attn.*``: kinds and globs as
`fxlens.analyzer.plan.recompute` reads them), or of the modules that make the layout fit for
the least recompute (``ckpt=auto``: `fxlens.analyzer.plan.auto_recompute`), or op by op as
torchtitan's policy saves and recomputes (``ckpt=ops``: `fxlens.analyzer.plan.op_policy`);
``offload`` keeps the optimizer state and master weights in host memory; ``v`` virtual
stages per GPU (interleaved 1F1B); ``layout=`` which virtual stage holds which layers, as
Megatron-core writes it (``layout=Et*4|(t*4|)*14tmL``: `fxlens.analyzer.plan.pipeline_layout`;
it sets v), or ``layout=slots`` (the embedding and the loss each a layer's slot of the even
split); left out, the blocks split evenly, the embedding on the first stage and the head and
loss on the last; ``micro_batches`` per step per data-parallel rank (gradient accumulation
when pp = 1).

``tp-overlap`` runs the tensor-parallel collectives beside the GEMMs they feed, in chunks
(Megatron-core's ``tp_comm_overlap``, PyTorch's async TP): only what the GEMMs do not cover,
and one chunk of it, stays exposed.
``cp_comm=`` how context-parallel GPUs exchange a layer's tokens (``p2p`` ring attention, the
default; ``a2a`` head all-to-alls, DeepSpeed-Ulysses; ``allgather`` K/V gathers:
`fxlens.analyzer.plan.context_parallel`).

Expert routing: ``dispatch=alltoall`` sends each token once per chosen expert (Megatron-core's
``alltoall`` dispatcher); ``dispatch=deepep`` once per destination node across nodes and once
per GPU inside one (DeepEP, Megatron-core's ``flex``; ``dispatch=hybridep``: the same
rows by its HybridEP backend, on fewer SMs); left out, ``deepep`` when the expert
group spans nodes and ``alltoall`` inside one node, as published recipes choose.
``a2a-overlap`` hides each micro-batch's all-to-all behind another micro-batch's compute
(Megatron-core's ``overlap_moe_expert_parallel_comm``, 1F1B forward/backward merging, layer
by layer: `fxlens.analyzer.plan.a2a_overlap`).
``routing=blocks`` gives each token k consecutive experts, as a benchmarking gate does
(NeMo Automodel's ``fake_balanced_gate``, which has no weights: no router runs); left out,
``balanced``: k experts drawn uniformly within the model's routing groups
(`fxlens.analyzer.plan.routing`).

CUDA graphs: ``graphs`` (or ``graphs=full``) replays the whole step as captured graphs (no
host launches), ``graphs=layers`` every repeated block (Megatron-core's per-layer graphs),
``graphs=attn+moe_router`` the modules of those kinds (`ckpt=`'s kinds and globs, plus
``moe_router``, ``moe_preprocess`` and ``mamba``, Megatron-core's ``cuda_graph_scope``
names); left out, the host launches every kernel and a layout's step is at least the host's
time (`fxlens.analyzer.plan.host`).

Compression (`fxlens.analyzer.plan.compression`): ``gradq=int8|fp8`` gradient collectives in
8 bits, ``powersgd=R`` DDP's all-reduce as rank-R factors, ``zeropp`` ZeRO++ (ZeRO-3's
int8 weight gathers, node-local backward gathers, int4 gradients).

Text: comma-separated names and ``key=value`` pairs, e.g. ``fsdp``, ``ddp``, ``zero2``,
``hsdp``, ``dp=2,tp=4,pp=2,zero=1,sp``, ``dp=4,tp=8,pp=9,cp=2,v=7,sp``, ``tp=2,pp=16,ep=64``.
A ``dp`` left out is filled from the GPU count, which must then be given; a degree given twice
is refused. No torch here: the CLI checks the text before loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fxlens.analyzer.plan.pipeline_layout import SLOTS, parse_layout
from fxlens.analyzer.plan.routing import ROUTINGS

NAMED: dict[str, dict[str, int | bool | str | tuple[str, ...]]] = {
    "ddp": {"zero": 0}, "zero1": {"zero": 1}, "zero2": {"zero": 2}, "zero3": {"zero": 3},
    "fsdp": {"zero": 3}, "hsdp": {"zero": 3, "hybrid": True},
    "fsdp-hybrid": {"zero": 3, "hybrid": True}, "sp": {"sp": True}, "ckpt": {"checkpoint": True},
    "offload": {"offload": True}, "a2a-overlap": {"a2a_overlap": True},
    "zeropp": {"zeropp": True}, "tp-overlap": {"tp_overlap": True},
    "graphs": {"graphs": ("full",)},
}
GRADIENT_FORMATS = ("int8", "fp8")
OPS = "ops"                      # ``ckpt=ops``: the op-level policy
FULL_GRAPHS = "full"             # ``graphs``: the whole step as CUDA graphs
LAYER_GRAPHS = "layers"          # ``graphs=layers``: each repeated block as CUDA graphs
DISPATCHERS = ("alltoall", "deepep", "hybridep")
CP_COMMS = ("p2p", "a2a", "allgather")     # Megatron-core's cp_comm_type: ring, Ulysses, gather
DEGREES = ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "v", "powersgd")
MAX_DEGREE = 1 << 20


@dataclass(frozen=True)
class Strategy:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None          # None: tp without expert parallelism, 1 with it
    zero: int = 0
    hybrid: bool = False
    sp: bool = False
    checkpoint: bool = False        # every repeated block recomputed
    recompute: tuple[str, ...] = () # selective: module kinds or path globs (plan/recompute.py)
    checkpoint_auto: bool = False   # the least recompute that fits (plan/auto_recompute.py)
    checkpoint_ops: bool = False    # torchtitan's op-level policy (plan/op_policy.py)
    offload: bool = False
    v: int = 1
    micro_batches: int = 1
    dispatch: str | None = None     # `DISPATCHERS`; None: deepep across nodes
    a2a_overlap: bool = False       # expert all-to-all hidden behind another micro-batch
    routing: str | None = None      # "balanced" or "blocks"; None: balanced
    gradq: str | None = None        # gradient collectives in "int8" or "fp8"
    powersgd: int = 0               # PowerSGD rank of DDP's gradient all-reduce (0: off)
    zeropp: bool = False            # ZeRO++: int8 weight gathers, hpZ, int4 gradients
    layout: str | None = None       # Megatron's pipeline layout; None: blocks split evenly
    cp_comm: str | None = None      # `CP_COMMS`; None: p2p (ring attention)
    tp_overlap: bool = False        # tp collectives overlapped with their GEMMs
    graphs: tuple[str, ...] = ()    # CUDA graphs: ("full",) or module kinds (plan/host.py)

    @property
    def compresses(self) -> bool:
        return self.gradq is not None or self.powersgd > 0 or self.zeropp

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else (1 if self.ep > 1 else self.tp)

    @property
    def expert_dp(self) -> int:
        """Data-parallel replicas of each expert: tp · cp · dp / (ep · etp)."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @property
    def label(self) -> str:
        """The strategy as text `parse` reads back (degrees of 1 left out, dp always shown)."""
        parts = [f"dp={self.dp}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "cp", "ep", "v")
                  if getattr(self, k) > 1]
        if self.etp is not None:
            parts.append(f"etp={self.etp}")
        if self.zero:
            parts.append("hsdp" if self.hybrid else f"zero={self.zero}")
        if self.dispatch is not None:
            parts.append(f"dispatch={self.dispatch}")
        if self.routing is not None:
            parts.append(f"routing={self.routing}")
        if self.cp_comm is not None:
            parts.append(f"cp_comm={self.cp_comm}")
        if self.recompute:
            parts.append(f"ckpt={'+'.join(self.recompute)}")
        if self.checkpoint_auto:
            parts.append("ckpt=auto")
        if self.checkpoint_ops:
            parts.append("ckpt=ops")
        if self.graphs:
            parts.append("graphs" if self.graphs == (FULL_GRAPHS,) else
                         f"graphs={'+'.join(self.graphs)}")
        if self.gradq is not None:
            parts.append(f"gradq={self.gradq}")
        if self.powersgd:
            parts.append(f"powersgd={self.powersgd}")
        if self.layout is not None:
            parts.append(f"layout={self.layout}" if self.layout == SLOTS else
                         f"layout={self.layout.replace('e', 'E').replace('l', 'L')}")
        parts += [name for name, on in (("sp", self.sp), ("ckpt", self.checkpoint),
                                        ("offload", self.offload),
                                        ("a2a-overlap", self.a2a_overlap),
                                        ("zeropp", self.zeropp),
                                        ("tp-overlap", self.tp_overlap)) if on]
        return ",".join(parts)

    def problems(self) -> list[str]:
        """Why this combination is not a layout (empty when it is one)."""
        found = []
        if self.zero not in (0, 1, 2, 3):
            found.append(f"zero={self.zero}: ZeRO stages are 0 (DDP), 1, 2 and 3")
        if self.hybrid and self.zero != 3:
            found.append("hybrid sharding is a ZeRO-3/FSDP layout")
        if self.sp and self.tp == 1:
            found.append("sequence parallel splits along tp: it needs tp > 1")
        if self.tp_overlap and self.tp == 1:
            found.append("tp-overlap hides tensor-parallel transfers: it needs tp > 1")
        stage = self.tp * self.cp * self.dp
        if stage % (self.ep * self.expert_tp):
            found.append(f"ep·etp = {self.ep}·{self.expert_tp} must divide the GPUs of a "
                         f"pipeline stage, tp·cp·dp = {stage} (experts are laid out over them)")
        if self.checkpoint and self.recompute:
            found.append(f"ckpt (every block) and ckpt={'+'.join(self.recompute)} (selective) "
                         f"exclude each other: give one")
        if self.checkpoint_auto and (self.checkpoint or self.recompute):
            found.append("ckpt=auto chooses what to recompute: give it alone")
        if (self.checkpoint_ops and (self.checkpoint or self.recompute or self.checkpoint_auto)
                or OPS in self.recompute):
            found.append("ckpt=ops (op-level selective recompute) excludes every other ckpt: "
                         "give it alone")
        if self.gradq is not None and self.gradq not in GRADIENT_FORMATS:
            found.append(f"gradq={self.gradq}: gradient formats are "
                         f"{' and '.join(GRADIENT_FORMATS)}")
        if self.powersgd and self.zero != 0:
            found.append("powersgd compresses DDP's all-reduce (PyTorch's powerSGD_hook): "
                         "it needs zero=0 (ddp)")
        if self.zeropp and self.zero != 3:
            found.append("zeropp is ZeRO-3's (ZeRO++): it needs zero=3 (fsdp)")
        if sum((self.gradq is not None, self.powersgd > 0, self.zeropp)) > 1:
            found.append("gradq, powersgd and zeropp each compress the gradients: give one")
        if self.compresses and self.dp * self.cp == 1:
            found.append("compression shrinks data-parallel transfers: it needs dp·cp > 1")
        if self.dispatch is not None and self.dispatch not in DISPATCHERS:
            found.append(f"dispatch={self.dispatch}: dispatchers are "
                         f"{', '.join(DISPATCHERS[:-1])} and {DISPATCHERS[-1]}")
        if self.cp_comm is not None and self.cp_comm not in CP_COMMS:
            found.append(f"cp_comm={self.cp_comm}: context-parallel exchanges are "
                         f"{', '.join(CP_COMMS)}")
        elif self.cp_comm is not None and self.cp == 1:
            found.append("cp_comm= says how context-parallel GPUs exchange: it needs cp > 1")
        if self.routing is not None and self.routing not in ROUTINGS:
            found.append(f"routing={self.routing}: routings are {' and '.join(ROUTINGS)}")
        if (self.a2a_overlap or self.dispatch is not None or self.routing is not None) \
                and self.ep == 1:
            found.append("dispatch, routing and a2a-overlap route tokens between GPUs: they "
                         "need ep > 1")
        if FULL_GRAPHS in self.graphs and len(self.graphs) > 1:
            found.append("graphs=full replays the whole step: give it alone")
        if self.v > 1 and self.pp == 1:
            found.append("interleaved stages (v > 1) need pp > 1")
        if self.layout is not None:
            found += self._layout_problems()
        if self.micro_batches < 1:
            found.append("micro-batches must be ≥ 1")
        return found

    def _layout_problems(self) -> list[str]:
        if self.pp == 1:
            return ["layout= places layers on pipeline stages: it needs pp > 1"]
        if self.layout == SLOTS:    # laid out per model: `misfits` checks it divides
            return []
        try:
            stages = parse_layout(self.layout or "")
        except ValueError as error:
            return [str(error)]
        if len(stages) != self.pp * self.v:
            return [f"layout has {len(stages)} virtual stages, pp·v = {self.pp}·{self.v} = "
                    f"{self.pp * self.v}"]
        return []


def parse(text: str, gpus: int | None = None, micro_batches: int = 1) -> Strategy:
    """`text` as a `Strategy`; a missing ``dp`` is ``gpus / (tp · pp · cp)``. ValueError on
    anything it cannot read, naming the part."""
    values: dict[str, Any] = {}
    for raw in text.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        if "=" in part:
            key, _, number = (s.strip() for s in part.partition("="))
            if key == "ckpt" and number == "full":
                _set(values, "checkpoint", True, text)
            elif key == "ckpt" and number == "auto":
                _set(values, "checkpoint_auto", True, text)
            elif key == "ckpt" and number == OPS:
                _set(values, "checkpoint_ops", True, text)
            elif key == "ckpt":
                _set(values, "recompute", _selective(number), text)
            elif key == "graphs":
                _set(values, "graphs", _selective(number, key), text)
            elif key in ("dispatch", "gradq", "routing", "layout", "cp_comm"):
                _set(values, key, number, text)
            else:
                _set(values, key, _degree(key, number), text)
        elif part in NAMED:
            for name, setting in NAMED[part].items():
                _set(values, name, setting, text)
        else:
            raise ValueError(f"unknown strategy {part!r} in {text!r}; known names: "
                             f"{', '.join(NAMED)}, or degrees like dp=2,tp=4,pp=2,zero=1")
    strategy = replace(Strategy(micro_batches=micro_batches), **values)
    if "layout" in values and "v" not in values and strategy.pp > 1:
        stages = _stage_count(values["layout"])
        if stages and stages % strategy.pp == 0:   # the layout sets v, as Megatron reads it
            strategy = replace(strategy, v=stages // strategy.pp)
    if "dp" not in values:
        if gpus is None:
            raise ValueError(f"{text!r} does not say how many GPUs: add --gpus N, or dp=N")
        inner = strategy.tp * strategy.pp * strategy.cp
        if gpus % inner:
            raise ValueError(f"--gpus {gpus} is not a multiple of tp·pp·cp = {inner}")
        strategy = replace(strategy, dp=gpus // inner)
    elif gpus is not None and strategy.gpus != gpus:
        raise ValueError(f"{text!r} uses dp·tp·pp·cp = {strategy.gpus} GPUs, not --gpus {gpus}")
    problems = strategy.problems()
    if problems:
        raise ValueError(f"{text!r}: {'; '.join(problems)}")
    return strategy


def _set(values: dict[str, Any], key: str, value: Any, text: str) -> None:
    """One setting; the same one given twice (``tp=2,tp=4``, ``fsdp,zero=1``) is refused."""
    if key in values:
        name = ("ckpt" if key in ("checkpoint", "recompute", "checkpoint_auto", "checkpoint_ops")
                else key)
        raise ValueError(f"{name} is given twice in {text!r}: give each setting once")
    values[key] = value


def _degree(key: str, number: str) -> int:
    if key not in DEGREES:
        raise ValueError(f"unknown degree {key!r}; known: {', '.join(DEGREES)}, and ckpt=, "
                         f"dispatch=, gradq=, routing=, layout=, cp_comm=, graphs=")
    try:
        value = int(number)
    except ValueError:
        raise ValueError(f"{key}={number!r}: a whole number is needed") from None
    if value < (0 if key == "zero" else 1):
        raise ValueError(f"{key}={value}: degrees are ≥ 1 (zero ≥ 0)")
    if value > MAX_DEGREE:
        raise ValueError(f"{key}={value}: more than {MAX_DEGREE:,} is not a layout")
    return value


def _selective(value: str, key: str = "ckpt") -> tuple[str, ...]:
    patterns = tuple(p.strip() for p in value.split("+") if p.strip())
    if not patterns:
        raise ValueError(f"{key}= needs full, or module kinds or path globs joined by '+' "
                         f"({key}=norm+act, {key}=core_attn, {key}=self_attn.*)")
    return patterns


def _stage_count(layout: str) -> int:
    """The virtual stages of `layout`, 0 when it cannot be read (`problems` says why) or is
    laid out per model (``slots``)."""
    if layout == SLOTS:
        return 0
    try:
        return len(parse_layout(layout))
    except ValueError:
        return 0
