"""Coded findings about how attention is called (FUS009): work a kernel does because of the
way it is asked, not because the model needs it.

FUS009 sits with the fusion findings (same `Match`, same table, same ``analyze explain``):
its fix, like theirs, changes the kernels that run, not the model's maths. It is the first
finding that saves FLOPs as well as bytes (`Match.flops_saved`): the reports show both, and
its time saved adds the skipped work at the device's attention rate.

Rule-facing API used: `fxlens.analyzer.core` and `fxlens.analyzer.fusion.types`; the FLOPs
come from the attention cost rules (`fxlens.rules.attention.skippable`), so the finding
and the count can never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import Node, TensorRef
from fxlens.analyzer.fusion.types import FusionGraph, Match, fusion_rule
from fxlens.rules.attention import (
    BACKWARD_OPS,
    MASKED_OPS,
    Attn,
    causal_scores,
    forward_flops,
    skippable,
)
from fxlens.rules.mask_values import mask_builders
from fxlens.rules.masks import MASK_ARGUMENTS, MaskPattern, judged


@fusion_rule("FUS009", priority=5)
def explicit_causal_mask(fg: FusionGraph, node: Node) -> Match | None:
    """Attention handed an exactly causal or sliding-window mask a kernel could skip.

    A kernel handed an explicit mask (``attn_mask``: the math, memory-efficient and cuDNN
    backends alike) computes every score, the masked ones too, and the B·H·T·T mask is built
    and read by every layer. Called with ``is_causal=True`` and no mask, a flash kernel skips
    the upper triangle: at long context about half of the attention FLOPs, forward and
    backward, and no mask is ever built. `transformers`' own causal LMs already do this;
    models that build their mask themselves (Falcon, a ``tril`` by hand) do not. A sliding
    window (each query sees its last w keys) is skipped beyond the window by kernels that
    take one: flash-attn's ``window_size``, FlexAttention's block mask.

    Fix: F.scaled_dot_product_attention(q, k, v, is_causal=True) with no attn_mask
    Fix (lower-right): attn_mask=torch.nn.attention.bias.causal_lower_right(T_q, T_k), which
    SDPA runs as a causal kernel aligned to the last key (queries after a KV cache)
    Fix (window): a kernel that takes the window: attn_implementation="flash_attention_2" in
    transformers, flash_attn_func(q, k, v, causal=True, window_size=(w - 1, 0)), or
    flex_attention with a sliding-window block mask
    """
    if node.packet not in MASKED_OPS:
        return None
    skipped, flops, verdict = skippable(OpCall(node, fg.graph))
    if skipped <= 0:
        return None
    mask = next(ref for name in MASK_ARGUMENTS if (ref := node.args.get(name)) is not None)
    built = _mask_tensors(fg, mask)
    spec = fg.graph.spec(mask)
    shape = "×".join(map(str, spec.shape)) if spec is not None else "?"
    dtype = spec.dtype if spec is not None else "?"
    what, kernel, variant = {
        MaskPattern.CAUSAL: ("an exactly causal", "a causal kernel", ""),
        MaskPattern.CAUSAL_LOWER_RIGHT: ("an exactly causal (aligned to the last key)",
                                         "a causal kernel", "lower-right"),
        MaskPattern.WINDOW: (f"a sliding-window ({verdict.window} keys per query)",
                             "a windowed kernel", "window"),
    }[verdict.mask]
    return Match(
        (node.id,), built,
        f"{'attention backward' if node.packet in BACKWARD_OPS else 'attention'} is handed "
        f"{what} {shape} {dtype} mask, so its kernel computes every score: {kernel} skips "
        f"{skipped / flops:.0%} of its FLOPs and builds no mask",
        fix_variant=variant, flops_saved=skipped)


def _mask_tensors(fg: FusionGraph, mask: TensorRef) -> tuple[TensorRef, ...]:
    """The mask and every tensor made only to build it (a position ``arange`` that rotary
    embeddings read too is not): none of them is made once the call passes is_causal."""
    builders = mask_builders(fg.graph, mask)
    inside = {n.id for n in builders}
    out = [fg.source(mask)]
    for builder in builders:
        for index in range(len(builder.outputs)):
            ref = TensorRef(builder.id, index)
            users = fg.consumers.get(ref, [])
            if users and all(u in inside or fg.node(u).packet in MASKED_OPS for u in users):
                out.append(ref)
    return tuple(dict.fromkeys(out))


def hand_causal_saving(fg: FusionGraph, first: Node, between: Sequence[Node], second: Node
                       ) -> tuple[int, int]:
    """For attention written by hand (``first`` matmul → `between` → ``second`` matmul): the
    forward FLOPs a causal kernel would skip when the scores are masked by an exactly causal
    mask (added as a float bias, or chosen by ``where``), and the dense kernel's FLOPs; (0,
    dense) when no such mask is found. The same formula as the SDPA rules: the finding and a
    fused call's count agree."""
    scores = first.outputs[0] if first.outputs else None
    values = second.outputs[0] if second.outputs else None
    query = fg.graph.spec(next(first.input_refs()))
    if scores is None or values is None or query is None or len(scores.shape) < 2:
        return 0, 0
    t_q, t_k = scores.shape[-2:]
    dense = Attn(scores.numel // max(t_q * t_k, 1), t_q, query.shape[-1], values.shape[-1],
                 t_q * t_k)
    path = {first.id, *(n.id for n in between)}
    for node in between:
        mask = _mask_operand(fg, node, path)
        if mask is not None and judged(fg.graph, mask, t_q, t_k).mask is MaskPattern.CAUSAL:
            causal = Attn(dense.bh, t_q, dense.d_qk, dense.d_v, causal_scores(t_q, t_k))
            return forward_flops(dense) - forward_flops(causal), forward_flops(dense)
    return 0, forward_flops(dense)


def _mask_operand(fg: FusionGraph, node: Node, path: set[int]) -> TensorRef | None:
    """The mask `node` applies to the scores on `path`: the other operand of an ``add``, the
    condition of a ``where`` that keeps the scores where it holds."""
    if node.packet == "aten.add":
        refs = [r for r in (node.args.get("self"), node.args.get("other"))
                if isinstance(r, TensorRef)]
        off_path = [r for r in refs if fg.source(r).node not in path]
        return off_path[0] if len(refs) == 2 and len(off_path) == 1 else None
    if node.packet == "aten.where":
        kept, condition = node.args.get("self"), node.args.get("condition")
        if isinstance(kept, TensorRef) and isinstance(condition, TensorRef) and \
                fg.source(kept).node in path:
            return condition
    return None
