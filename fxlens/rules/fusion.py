"""Fusion op knowledge: which ops are pointwise, reductions, GEMMs, and the pattern rules.

Kinds come from the rule families, never from a second list of ops: an op costed by a rule of
`fxlens.rules.pointwise` (the `POINTWISE` table), `data_movement` or `indexing` is pointwise
for a fusing compiler (copies, casts, gathers and masks are loads and stores in a generated
loop), `reduction`, `norm` and `pooling` are reductions, `matmul` and `conv` are GEMMs,
`attention` and `rnn` (and ops of third-party rule packs) are opaque library calls; a declared
free op (`VIEW_OPS`, `METADATA_OPS`) launches nothing. Specific ops (softmax, batch norm, layer
norm) are recognised by the cost rule that costs them (`registry.lookup(node) is
reduction.softmax`), so their names live in one place.

The patterns are ``@fusion_rule(code, priority)`` matchers; they apply by ascending priority,
the most specific first (an intermediate is credited to the first finding that claims it; see
`fxlens.analyzer.fusion.kernels`); the priorities leave gaps of 10 for rule packs to slot in.
`FUSION_RULES` are the built-in ones in that order (this module's and FUS009 of
`fxlens.rules.attention_findings`); `fusion_rules(registry)` those of a
registry (with any pack's). Each matcher's docstring says what it finds, why it matters and,
in its ``Fix:`` lines, how to fix it: the reports and ``analyze explain FUS00n`` show that
text, and a `Match` adds only its own ops and shapes (and which ``Fix:`` line applies).

Rule-facing API used: `fxlens.analyzer.core` and `fxlens.analyzer.fusion.types`.

NB: sort/topk/nonzero (costed in reduction/indexing) are library calls in real compilers,
not fusable loops; they are rare in model graphs and classified with their family here.
NB: hand-written norms are recognised in their common forms (``x * rsqrt(mean(x²) + eps)``,
``(x - mean(x)) / sqrt(mean((x - mean)²) + eps)``, with an optional affine), not via var/std.
"""

from __future__ import annotations

from collections.abc import Mapping

from fxlens.analyzer.core.costs import CostRegistry, declared_coded
from fxlens.analyzer.core.graph import Node, NodeKind, TensorRef
from fxlens.analyzer.fusion.types import (
    FAMILY,
    FusionGraph,
    FusionRule,
    Match,
    OpKind,
    fusion_rule,
)
from fxlens.rules import attention_findings, conv, matmul, norm, reduction
from fxlens.rules.attention_findings import hand_causal_saving

FAMILY_KINDS: Mapping[str, OpKind] = {
    "pointwise": OpKind.POINTWISE, "data_movement": OpKind.POINTWISE,
    "indexing": OpKind.POINTWISE, "views": OpKind.FREE,
    "reduction": OpKind.REDUCTION, "norm": OpKind.REDUCTION, "pooling": OpKind.REDUCTION,
    "matmul": OpKind.GEMM, "conv": OpKind.GEMM,
    "attention": OpKind.EXTERN, "rnn": OpKind.EXTERN, "fft": OpKind.EXTERN,
}
SOFTMAX_RULES = (reduction.softmax, reduction.safe_softmax)
NORM_RULES = (norm.layer_norm, norm.rms_norm)
BATCH_NORM_RULES = (norm.batch_norm, norm.batch_norm_eval)


def family(rule: object) -> str:
    """The rule family (module name under fxlens.rules) of a cost rule, '' if none."""
    module = getattr(rule, "__module__", "") or ""
    return module.rpartition(".")[2] if module.startswith("fxlens.rules.") else ""


def op_kind(node: Node, registry: CostRegistry) -> OpKind:
    """How a fusing compiler treats this call (see the module docstring)."""
    rule = registry.lookup(node)
    if rule is None:
        return OpKind.EXTERN
    if isinstance(rule, str):
        return OpKind.FREE
    return FAMILY_KINDS.get(family(rule), OpKind.EXTERN)


def kinds_of(nodes: list[Node], registry: CostRegistry) -> dict[int, OpKind]:
    return {n.id: op_kind(n, registry) for n in nodes if n.kind is NodeKind.CALL}


# --- helpers ---------------------------------------------------------------------------------

def _op(node: Node) -> str:
    return node.packet.removeprefix("aten.")


def _shape(fg: FusionGraph, node: Node) -> str:
    spec = node.outputs[0] if node.outputs else None
    return "×".join(map(str, spec.shape)) if spec is not None else "?"


def _chain(fg: FusionGraph, start: Node) -> list[Node]:
    """`start` and the pointwise ops after it, each the sole reader of the one before."""
    chain = [start]
    while True:
        nxt = fg.sole_consumer(chain[-1])
        if nxt is None or fg.kind(nxt.id) is not OpKind.POINTWISE or len(nxt.outputs) != 1:
            return chain
        chain.append(nxt)


def _internal(fg: FusionGraph, nodes: list[Node]) -> tuple[TensorRef, ...]:
    """Outputs of `nodes` that only `nodes` read (and that are no graph output)."""
    inside = {n.id for n in nodes}
    refs = []
    for node in nodes:
        for index in range(len(node.outputs)):
            ref = TensorRef(node.id, index)
            users = fg.consumers.get(ref, [])
            if users and ref not in fg.outputs and all(u in inside for u in users):
                refs.append(ref)
    return tuple(refs)


def _names(nodes: list[Node]) -> str:
    return " → ".join(_op(n) for n in nodes)


def _is_family(fg: FusionGraph, node: Node, module: object) -> bool:
    return family(fg.rule_of(node)) == getattr(module, "__name__", "").rpartition(".")[2]


def _pointwise_head(fg: FusionGraph, node: Node) -> bool:
    """No pointwise or GEMM producer hands its output to `node` alone."""
    for src in fg.sources(node):
        producer = fg.node(src.node)
        if (producer.kind is NodeKind.CALL
                and fg.kind(producer.id) in (OpKind.POINTWISE, OpKind.GEMM)
                and fg.sole_consumer(producer, src.index) is node):
            return False
    return True


# --- the rules -------------------------------------------------------------------------------

@fusion_rule("FUS001", priority=60)
def elementwise_chain(fg: FusionGraph, node: Node) -> Match | None:
    """Chains of elementwise ops whose intermediates round-trip through memory.

    Each op of the chain is its own kernel: it reads its input from memory and writes its
    output back, so a chain of n ops moves n − 1 intermediates twice for a few FLOPs each;
    elementwise kernels are memory-bound, so time grows with every link. Fused ops exist for
    the common chains: F.silu for x·sigmoid(x), F.gelu, torch.addcmul, torch.lerp.

    Fix: torch.compile (fuses the chain into one kernel), or one fused op such as F.silu /
    F.gelu / torch.addcmul
    """
    if fg.kind(node.id) is not OpKind.POINTWISE or not _pointwise_head(fg, node):
        return None
    chain = _chain(fg, node)
    if len(chain) < 2:
        return None
    return Match(tuple(n.id for n in chain), _internal(fg, chain),
                 f"{len(chain)} elementwise ops ({_names(chain)}) up to "
                 f"{_shape(fg, chain[-1])} each write their result and the next reads it back")


@fusion_rule("FUS002", priority=40)
def gemm_epilogue(fg: FusionGraph, node: Node) -> Match | None:
    """Matmul/conv epilogues: bias, activation, residual add or scaling after a GEMM.

    The GEMM writes its full output and an elementwise kernel reads it back to add a bias,
    apply an activation, add a residual or scale; a GEMM kernel can apply these to its tile
    before the single store. TensorRT fuses epilogues as well.

    Fix: torch.compile(mode='max-autotune') (epilogue fused into a Triton GEMM), or a cuBLASLt
    epilogue (torch._addmm_activation for bias + ReLU/GELU)
    Fix (conv): torch.ao.quantization.fuse_modules(model.eval(), [[conv, relu]]) or oneDNN
    conv+eltwise at inference; torch.compile(mode='max-autotune')
    """
    if fg.kind(node.id) is not OpKind.GEMM:
        return None
    first = fg.sole_consumer(node)
    if first is None or fg.kind(first.id) is not OpKind.POINTWISE:
        return None
    chain = [node, *_chain(fg, first)]
    return Match(tuple(n.id for n in chain), _internal(fg, chain),
                 f"{_op(node)} output {_shape(fg, node)} is written, then read back by its "
                 f"epilogue ({_names(chain[1:])})",
                 fix_variant="conv" if _is_family(fg, node, conv) else "")


@fusion_rule("FUS003", priority=30)
def conv_batch_norm(fg: FusionGraph, node: Node) -> Match | None:
    """Eval-mode BatchNorm right after a convolution (or linear): foldable into its weights.

    In eval mode BatchNorm is an affine map per channel with fixed statistics, so it can be
    folded into the preceding conv's weight and bias: the BatchNorm kernel, and the write and
    re-read of the conv's output, disappear at zero runtime cost. Not in training mode (the
    batch statistics change every step). torch.compile with
    torch._inductor.config.freezing = True folds it as well.

    Fix: fold at export: torch.ao.quantization.fuse_modules(model.eval(), [['conv', 'bn']]) or
    torch.nn.utils.fusion.fuse_conv_bn_eval
    """
    rule = fg.rule_of(node)
    if rule not in BATCH_NORM_RULES or (rule is norm.batch_norm and node.args.get("training")):
        return None
    producer = fg.producer(node, "input")
    if producer is None or fg.kind(producer.id) is not OpKind.GEMM:
        return None
    if fg.sole_consumer(producer) is not node:
        return None
    return Match((producer.id, node.id), (fg.out(producer),),
                 f"eval BatchNorm after {_op(producer)} ({_shape(fg, producer)}) can be folded "
                 "into its weights: one kernel and one intermediate fewer")


def _walk_back(fg: FusionGraph, node: Node) -> tuple[list[Node], Node | None]:
    """Single-reader pointwise producers above `node`, nearest last, and the op above them."""
    path: list[Node] = []
    current = node
    while True:
        producer = fg.producer(current)
        if producer is None or fg.sole_consumer(producer) is not current:
            return path[::-1], producer
        if fg.kind(producer.id) is not OpKind.POINTWISE:
            return path[::-1], producer
        path.append(producer)
        current = producer


@fusion_rule("FUS004", priority=10)
def hand_attention(fg: FusionGraph, node: Node) -> Match | None:
    """Attention written by hand: matmul → scale/mask → softmax → matmul.

    The T×T score matrix (per batch and head) is written by the first matmul, read and written
    again by the scaling, the mask and the softmax, then read by the second matmul: memory
    quadratic in the sequence length, and traffic that dominates at long context. Fused
    attention kernels (flash, memory-efficient) never materialise it.

    Fix: F.scaled_dot_product_attention(q, k, v, is_causal=True / attn_mask=...), flash-attn or
    xformers.ops.memory_efficient_attention
    """
    if fg.rule_of(node) not in SOFTMAX_RULES:
        return None
    before, first = _walk_back(fg, node)
    if first is None or fg.kind(first.id) is not OpKind.GEMM or fg.sole_consumer(
            first) is not (before[0] if before else node):
        return None
    after = _chain(fg, node)
    second = fg.sole_consumer(after[-1])
    if second is None or fg.kind(second.id) is not OpKind.GEMM:
        return None
    nodes = [first, *before, *after, second]
    scores = node.outputs[0]
    size = scores.nbytes if scores is not None else 0
    skipped, dense = hand_causal_saving(fg, first, before, second)
    causal = (f"; its mask is exactly causal: SDPA with is_causal=True also skips "
              f"{skipped / dense:.0%} of the forward FLOPs" if skipped else "")
    return Match(tuple(n.id for n in nodes), _internal(fg, nodes),
                 f"attention written by hand ({_names(nodes)}): the {_shape(fg, node)} score "
                 f"matrix ({size} bytes) is materialised {len(nodes) - 2} times{causal}",
                 flops_saved=skipped)


def _gemm_input(fg: FusionGraph, node: Node) -> TensorRef | None:
    """The activation operand of a GEMM whose other operand is a parameter."""
    refs = list(dict.fromkeys(fg.source(r) for r in node.input_refs()))
    activations = [r for r in refs if not fg.is_param(r)]
    if len(activations) != 1 or len(refs) < 2:
        return None
    return activations[0]


@fusion_rule("FUS005", priority=70)
def sibling_projections(fg: FusionGraph, node: Node) -> Match | None:
    """Several projections of the same input (Q, K, V; gate and up) that one GEMM could do.

    Each projection is a separate GEMM that reads the same activation again and launches its
    own kernel; small GEMMs also use the device less well than one wide one. One
    nn.Linear(in, Σ out) does them all (GPT-2's c_attn; gate and up as one Linear with
    2 × intermediate outputs, then chunk). Compilers do not do this by default.

    Fix: concatenate the weights into one nn.Linear and split the output (fused QKV / gate-up
    projection)
    """
    if fg.kind(node.id) is not OpKind.GEMM or not _is_family(fg, node, matmul):
        return None
    x = _gemm_input(fg, node)
    if x is None:
        return None
    siblings = [u for u in fg.consumers.get(x, []) if fg.kind(u) is OpKind.GEMM
                and _is_family(fg, fg.node(u), matmul) and _gemm_input(fg, fg.node(u)) == x]
    if len(siblings) < 2 or node.id != min(siblings):
        return None
    modules = ", ".join(fg.node(u).module or "<root>" for u in siblings)
    return Match(tuple(siblings), (),
                 f"{len(siblings)} projections ({modules}) each read the same "
                 f"{_shape(fg, fg.node(x.node))} input: one GEMM over concatenated weights "
                 f"reads it once and launches 1 kernel instead of {len(siblings)}",
                 rereads=((x, len(siblings) - 1),))


def _last_dim_mean(fg: FusionGraph, node: Node) -> bool:
    if fg.rule_of(node) is not reduction.mean or not node.args.get("keepdim"):
        return False
    dims = node.args.get("dim")
    spec = fg.graph.spec(next(node.input_refs()))
    rank = len(spec.shape) if spec is not None else 0
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] % max(rank, 1) == rank - 1


def _squares(fg: FusionGraph, node: Node) -> TensorRef | None:
    """x for ``x ** 2`` or ``x * x``, else None."""
    refs = [fg.source(r) for r in node.input_refs()]
    if node.packet == "aten.pow" and node.args.get("exponent") == 2 and refs:
        return refs[0]
    if node.packet == "aten.mul" and len(refs) == 2 and refs[0] == refs[1]:
        return refs[0]
    return None


def _normalise(fg: FusionGraph, stats: Node, x: TensorRef) -> list[Node] | None:
    """From a statistic of x: the pointwise chain up to the op that applies it to x, then
    the affine ops (reading a parameter) right after it."""
    chain = _chain(fg, stats)
    applied = next((i for i, n in enumerate(chain) if i and x in fg.sources(n)), None)
    if applied is None:
        return None
    end = applied + 1
    while end < len(chain) and any(fg.is_param(s) for s in fg.sources(chain[end])):
        end += 1
    return chain[:end]


def _rms_region(fg: FusionGraph, mean: Node) -> tuple[list[Node], TensorRef] | None:
    square = fg.producer(mean)
    if square is None or fg.sole_consumer(square) is not mean:
        return None
    x = _squares(fg, square)
    rest = _normalise(fg, mean, x) if x is not None else None
    return ([square, *rest], x) if rest is not None and x is not None else None


@fusion_rule("FUS006", priority=20)
def hand_norm(fg: FusionGraph, node: Node) -> Match | None:
    """Norms built from primitive ops: an RMSNorm or LayerNorm written by hand.

    ``x * rsqrt(mean(x²) + eps) * w`` is five or more kernels, each writing a full-size (or
    per-row) intermediate that the next reads back; a norm kernel reads x once and writes the
    result once.

    Fix: nn.RMSNorm / F.rms_norm or F.layer_norm, a fused kernel (Liger-Kernel LigerRMSNorm,
    Apex FusedRMSNorm/FusedLayerNorm), or torch.compile
    """
    if not _last_dim_mean(fg, node):
        return None
    found = _rms_region(fg, node)
    if found is not None:
        region, kind = found[0], "RMSNorm"
    else:
        x = fg.source(next(node.input_refs()))
        centre = fg.sole_consumer(node)
        if centre is None or centre.packet != "aten.sub" or x not in fg.sources(centre):
            return None
        xc = fg.out(centre)
        variance = next((fg.sole_consumer(fg.node(u)) for u in fg.consumers.get(xc, [])
                         if _squares(fg, fg.node(u)) == xc), None)
        if variance is None or not _last_dim_mean(fg, variance):
            return None
        rest = _rms_region(fg, variance)
        if rest is None:
            return None
        region, kind = [node, centre, *rest[0]], "LayerNorm"
    return Match(tuple(n.id for n in region), _internal(fg, region),
                 f"{kind} written with {len(region)} primitive ops ({_names(region)})")


@fusion_rule("FUS007", priority=80)
def residual_norm(fg: FusionGraph, node: Node) -> Match | None:
    """A residual add followed by a norm (add + LayerNorm/RMSNorm pairs).

    The sum is written (it is the residual stream, needed later) and read straight back by the
    norm; a fused add + norm kernel writes the sum and the normalised output from one read of
    the two addends.

    Fix: a fused add + norm kernel (Liger-Kernel, Apex FusedAddRMSNorm, vLLM
    fused_add_rms_norm) or torch.compile
    """
    if fg.rule_of(node) not in NORM_RULES:
        return None
    producer = fg.producer(node, "input")
    if producer is None or producer.packet != "aten.add" or fg.sole_consumer(producer):
        return None
    norm_name = _op(node)
    return Match((producer.id, node.id), (),
                 f"residual add then {norm_name}: the {_shape(fg, producer)} sum is written and "
                 "read straight back by the norm",
                 rereads=((fg.out(producer), 1),))


@fusion_rule("FUS008", priority=50)
def reduction_prologue(fg: FusionGraph, node: Node) -> Match | None:
    """Reductions fed by elementwise producers (softmax inputs, norms, losses, masked sums).

    An elementwise result read by nothing but a reduction is written in full only to be read
    once and folded away; a fused kernel computes it inside the reduction loop. Fused ops
    cover the common cases: F.cross_entropy instead of log_softmax + nll_loss,
    torch.linalg.vector_norm instead of x.pow(2).sum().sqrt().

    Fix: torch.compile (fuses the producer into the reduction), or a fused op (F.cross_entropy,
    torch.linalg.vector_norm)
    """
    if fg.kind(node.id) is not OpKind.REDUCTION:
        return None
    before, _ = _walk_back(fg, node)
    if not before:
        return None
    nodes = [*before, node]
    return Match(tuple(n.id for n in nodes), _internal(fg, nodes),
                 f"{_op(node)} reduces the {_shape(fg, before[-1])} output of "
                 f"{_names(before)}, which nothing else reads")


def fusion_rules(registry: CostRegistry) -> tuple[FusionRule, ...]:
    """The fusion rules of `registry` (built-in and rule packs'), in the order they apply."""
    return registry.coded.of(FAMILY)


FUSION_RULES: tuple[FusionRule, ...] = tuple(sorted(
    (*declared_coded(FAMILY, __name__), *declared_coded(FAMILY, attention_findings.__name__)),
    key=lambda rule: rule.priority))
