"""The ``--serve`` pass: a decoder LM's prefill and decode steps captured as an engine runs
them (`fxlens.analyzer.capture.hf_decode`), costed, fused and timed on ``--device``
(`fxlens.analyzer.serve`).

Captures: the model rebuilt on the meta device with two decoder layers (every distinct kernel;
the second layer's kernels count once per layer past the first), its prefill of the prompt at
two batches, its decode step at two batches × two contexts (the prompt, and the prompt plus
the output): their kernels' work is affine in the batch and the context, so every point of
the curve is timed without another capture. Each graph is costed by the rules (as the report
is), grouped into the kernels of the default fusion plan (`fusion.kernels.fused_kernels`:
what a compiled engine launches), and each kernel rated at its dtype's and kernel class's
achievable figures (a model whose first k layers are dense captured with one dense and one
MoE layer; multi-head latent attention decoded against its latent with ``kv_b_proj``
absorbed, `capture.hf_mla`). The KV bytes per token come from the model's config
(`rules.kv_layouts`; an MLA latent on every GPU of a tensor-parallel group) in the weights'
dtype; the workspace is one prompt's prefill activations (half the simulated
peak at batch 2). What the rules say is served differently (`rules.serving`): the weights a
reduced ``--precision`` stores (linear layers' and experts'), the kernels reading the cache,
a MoE layer's routed experts (their E and k from the config); the tensor-parallel link's
bandwidth, per-call latency and NCCL's ring protocols come from the device (`rules.links`),
the in-flight batcher's caps from ``--max-num-tokens`` and ``--max-num-seqs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf_decode import (
    check_servable,
    decode_inputs,
    decode_step,
    layer_count,
    layers_standing_for,
    prefill_inputs,
    text_config,
    with_layers,
)
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import Serve
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion.kernels import fused_kernels
from fxlens.analyzer.memory.liveness import liveness
from fxlens.analyzer.plan.forward import forward_split
from fxlens.analyzer.plan.transfers import Group, latency_s
from fxlens.analyzer.serve.attention_dp import attention_data_parallel, exchange_step
from fxlens.analyzer.serve.estimate import ServeMemory, ServeRequest, serve_section
from fxlens.analyzer.serve.formats import Formats, scale_of, served_at
from fxlens.analyzer.serve.inflight import Engine
from fxlens.analyzer.serve.kernels import AffineStep, Kernel, Point, Routing, fit
from fxlens.analyzer.serve.mixed import shared_rows
from fxlens.analyzer.serve.steps import Link, Steps, sharded
from fxlens.analyzer.serve.windows import windowed_decode, windowed_prefill
from fxlens.analyzer.time.roofline import dtype_key, node_dtype
from fxlens.rules.fusion import kinds_of
from fxlens.rules.kv_layouts import layers_from_config
from fxlens.rules.links import ring_all_reduce_options
from fxlens.rules.parallel import PARALLEL
from fxlens.rules.serving import (
    KV_DTYPE_BYTES,
    WEIGHT_FORMATS,
    WeightFormat,
    cache_attention,
    expert_weight,
    moe_routing,
    routed_experts,
    weight_gemm,
)

if TYPE_CHECKING:
    from fxlens.pipeline import Context

BATCHES = (2, 4)       # capture points: batch 1 specialises some graphs (a squeezed dim)
KVGroups = tuple[tuple[int | None, int], ...]    # (window or None, KV bytes per token)


class ServePass:
    name = "serving"
    provides: tuple[type[Section], ...] = (Serve,)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return bool(options.serve)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        options, module = ctx.options, ctx.loaded.module
        spec = ctx.device_spec()
        assert spec is not None, "--serve is checked to come with --device"
        i, o = options.input_len, options.output_len
        check_servable(module)
        _check_context(module, i + o)
        layers = layer_count(module)
        small = with_layers(module, min(layers, 2))
        layer_of = _layer_index(small)
        counted = _layer_weights(layer_of, layers_standing_for(module))
        notes: list[str] = []
        windows = _windows(module, i + o, notes)
        tp = options.tp
        ctx.on_step("serving: capturing the prefill")
        prefill_graphs = [capture(small, prefill_inputs(b, i), ctx.registry, options.methods)
                          for b in BATCHES]
        routing = moe_routing(small.config)
        ranks = tp if options.attention_dp else 1
        moe_layers = _moe_layers(layer_of, layers_standing_for(module))
        prefill = _affine(ctx, [(b, i, g) for b, g in zip(BATCHES, prefill_graphs, strict=True)],
                          counted, "", notes, tp, routing, prefill=True, ranks=ranks,
                          exchange=lambda s: exchange_step(
                              "experts", _token_bytes(module), moe_layers(s), prefill=True),
                          adjust=lambda s: windowed_prefill(s, layer_of, windows, i,
                                                            _reads_cache) if windows else s)
        ctx.on_step("serving: capturing decode steps")
        step, layout = decode_step(small), layers_from_config(small.config)
        decode = _affine(ctx, [(b, c, capture(step, decode_inputs(small, b, c, layout),
                                              ctx.registry, options.methods))
                               for b in BATCHES for c in (i, i + o)], counted, "model.", notes,
                         tp, routing, cache_ways=_kv_ways(module, tp), ranks=ranks,
                         exchange=lambda s: exchange_step(
                             "experts", _token_bytes(module), moe_layers(s), prefill=False),
                         adjust=lambda s: windowed_decode(s, layer_of, windows) if windows else s)
        stored = WEIGHT_FORMATS.get(options.precision or "")
        formats, weights_bytes, kv_groups = _formats(module, options, report, stored, notes)
        reduced = _reduced_by(stored)
        served = [served_at(s[0], formats, reduced, _reads_cache) for s in (prefill, decode)]
        bus = spec.link_bytes_per_s(True)
        link = Link(bus, latency_s("all-reduce", Group(tp, 1), spec),
                    ring_all_reduce_options(spec.link_kind, tp, bus)
                    if tp <= spec.gpus_per_node else ())
        steps = Steps(served[0], served[1], tp, link, prefill[1], decode[1],
                      shared_rows(served[1], served[0], _reads_weights))
        workspace = liveness(prefill_graphs[0], ctx.registry).peak_activation_bytes // BATCHES[0]
        calls = (f"each all-reduce {link.latency_s * 1e6:.1f} µs per call (NCCL's latency "
                 f"model) plus its bytes at {link.bytes_per_s / 1e9:.0f} GB/s"
                 + (f", or the faster of NCCL's {len(link.protocols)} ring protocols for its "
                    f"size" if link.protocols else ""))
        if ranks > 1:
            weights_bytes = _per_rank_weights(module, weights_bytes, ranks, stored)
            notes.append(f"attention data-parallel over {ranks} GPUs: each runs attention, "
                         f"dense layers and the LM head on its own requests (their KV cache "
                         f"on it, the weights whole), the routed experts split {ranks} ways "
                         f"over every rank's tokens; memory figures per GPU, requests "
                         f"{ranks}× one GPU's; each MoE layer gathers and scatters the "
                         f"step's hidden states, timed as an all-reduce of them: {calls}")
        elif tp > 1:
            weights_bytes, kv_groups, workspace = _per_gpu(
                module, weights_bytes, kv_groups, workspace, tp, stored)
            notes.append(f"tensor parallel over {tp} GPUs: memory figures per GPU; {calls}"
                         + (f"; the routed experts split {tp} ways, each GPU the same work "
                            f"and one all-reduce of the tokens' hidden states per MoE layer "
                            f"as under expert parallelism over the {tp} (TensorRT-LLM's --ep "
                            f"{tp}, vLLM's --enable-expert-parallel)"
                            if routing is not None else ""))
        if routing is not None:
            notes.append(f"MoE: each decode step reads the experts its tokens route to, "
                         f"E·(1 − (1 − k/E)^tokens) of E = {routing[0]} per layer (k = "
                         f"{routing[1]}, uniform routing)")
        engine = Engine(options.max_num_tokens * ranks, options.max_num_seqs * ranks)
        notes.append(f"in-flight batching: at most {options.max_num_tokens} tokens per step "
                     f"and {options.max_num_seqs} requests in flight"
                     + (" on each rank" if ranks > 1 else "")
                     + " (--max-num-tokens, --max-num-seqs; TensorRT-LLM's defaults 8192 and "
                     "2048), prefills sharing steps with decodes")
        memory = ServeMemory(spec.driver_bytes, weights_bytes, workspace,
                             sum(size for _, size in kv_groups), spec.context_bytes, kv_groups,
                             replicas=ranks)
        request = ServeRequest(i, o, tuple(options.serve_batches), options.tpot_slo_s,
                               engine=engine)
        return (serve_section(steps, spec, layers, request, memory, sorted(set(notes)),
                              options.precision or "" if stored else ""),)


def _affine(ctx: Context, points: Sequence[tuple[int, int, Graph]],
            counted: Callable[[str], float], root: str, notes: list[str], tp: int,
            routing: tuple[int, int] | None, prefill: bool = False, cache_ways: int = 0,
            ranks: int = 1, exchange: Callable[[AffineStep], AffineStep] | None = None,
            adjust: Callable[[AffineStep], AffineStep] = lambda s: s
            ) -> tuple[AffineStep, AffineStep | None]:
    """The captures' kernels as one affine step (on one GPU of `tp`; `adjust`ed, e.g. to
    sliding windows; a MoE model's expert GEMMs read as `routing` routes the step's tokens;
    a decode's cache-reading kernels' bytes split `cache_ways`, the ways its KV heads split),
    and what each step all-reduces: a kernel per row-parallel output, its bytes one call's
    payload (None on one GPU). Over `ranks` > 1 GPUs the attention is data-parallel instead
    (`serve.attention_dp`) and a step all-reduces what `exchange` says."""
    step = adjust(fit([Point(b, c, _kernels(ctx, g, counted, root, notes))
                       for b, c, g in points]))
    if routing is not None:
        rows = tuple(r for r, k in enumerate(step.kernels) if routed_experts(k.target))
        step = replace(step, routing=Routing(routing[0], routing[1], rows, prefill))
    if ranks > 1 and exchange is not None:
        experts = [routed_experts(k.target) for k in step.kernels]
        return attention_data_parallel(step, experts, ranks), exchange(step)
    if tp <= 1:
        return step, None
    splits = [forward_split(g, PARALLEL) for _, _, g in points]
    reduce = fit([Point(b, c, tuple(
        Kernel("all-reduce", module, "", "", 0.0, float(size), counted(module), row)
        for row, size in sorted(split.reduce_bytes.items())
        for module in [g.nodes[row].module.removeprefix(root)]))
        for (b, c, g), split in zip(points, splits, strict=True)])
    ways = [tp if k.node in splits[0].split_nodes else 1 for k in step.kernels]
    return sharded(step, ways, ways, [(cache_ways or tp) if w > 1 and _reads_cache(k) else w
                                      for k, w in zip(step.kernels, ways, strict=True)]), reduce


def _per_gpu(module: nn.Module, weights: int, kv_groups: KVGroups, workspace: int, tp: int,
             stored: WeightFormat | None) -> tuple[int, KVGroups, int]:
    """(weights, KV per token, workspace) on one GPU of `tp`: every weight matrix but the
    input embedding split (attention and MLP projections, experts, the LM head; under a
    reduced format the linear layers' and experts' at its bytes), the K/V heads split
    (replicated past the KV head count), the prefill's activations split; norms, biases and
    the embedding replicated."""
    lookup: Any = module
    embedding = getattr(lookup.get_input_embeddings(), "weight", None)
    reduced = {id(w) for w in _stored_weights(module, stored)} if stored else set()
    split = sum(p.numel() * (stored.bytes_per_weight if stored and id(p) in reduced
                             else p.element_size())
                for p in module.parameters() if p.dim() >= 2 and p is not embedding)
    return (round(weights - split + split / tp),
            tuple((window, size // _kv_ways(module, tp)) for window, size in kv_groups),
            workspace // tp)


def _per_rank_weights(module: nn.Module, weights: int, ranks: int,
                      stored: WeightFormat | None) -> int:
    """Weights on one GPU under attention data parallelism: the routed experts' split `ranks`
    ways (at the stored format's bytes), every other weight whole."""
    experts = sum(p.numel() * (stored.bytes_per_weight if stored and stored.experts
                               else p.element_size())
                  for name, p in module.named_parameters() if expert_weight(name, p.dim()))
    return round(weights - experts + experts / ranks)


def _moe_layers(layer_of: Callable[[str], int | None], standing_for: tuple[int, int]
                ) -> Callable[[AffineStep], float]:
    """How many decoder layers of the whole model a step's routed-expert kernels are in."""
    def count(step: AffineStep) -> float:
        captured = {layer_of(k.module) for k in step.kernels if routed_experts(k.target)}
        return float(sum(standing_for[index] for index in captured if index is not None))
    return count


def _token_bytes(module: nn.Module) -> float:
    """One token's hidden state in the activations' dtype (the weights')."""
    return float(text_config(module).hidden_size * _element_bytes(module))


def _kv_ways(module: nn.Module, tp: int) -> int:
    """How many ways `tp` GPUs split the KV cache: by KV head, each GPU holding one whole
    past the head count (an MLA latent, one head, is on every GPU)."""
    return min(tp, min(layer.kv_heads for layer in layers_from_config(module.config)))


def _formats(module: nn.Module, options: Any, report: Report, stored: WeightFormat | None,
             notes: list[str]) -> tuple[Formats, int, KVGroups]:
    """(the formats, the weights' bytes, the KV bytes per token by window) served at: the linear
    layers' and experts' weights `stored` as ``--precision`` says (`rules.serving`), the
    cache at ``--kv-dtype``."""
    width = _element_bytes(module)
    weights: float = report.model.param_bytes + report.model.buffer_bytes
    kv_bytes = KV_DTYPE_BYTES.get(options.kv_dtype or "", width)
    if stored is not None:
        weights -= sum(w.numel() for w in _stored_weights(module, stored)) * (
            width - stored.bytes_per_weight)
        notes.append(f"{options.precision}: linear layers' "
                     + ("and experts' " if stored.experts else "") + "weights in "
                     f"{stored.bytes_per_weight:.3g} bytes each"
                     + (f" (one 16-bit scale per {stored.group})" if stored.group else "")
                     + (f", their GEMMs at the {stored.compute.upper()} peak" if stored.compute
                        else ", their GEMMs at 16 bits")
                     + "; lm_head, embeddings, norms and attention"
                     + (" at 16 bits" if stored.experts else ", and a MoE model's experts, at "
                        "16 bits"))
    per_token = _kv_groups(module, kv_bytes)
    cache = scale_of(kv_bytes, width)
    formats = (Formats(stored.compute, scale_of(stored.bytes_per_weight, width), cache)
               if stored else Formats(cache_scale=cache))
    return formats, round(weights), per_token


def _stored_weights(module: nn.Module, stored: WeightFormat) -> list[torch.Tensor]:
    """The weights a reduced serving format stores: the linear layers' the rules name and
    (unless the format keeps them at 16 bits) the MoE experts' stacked weights."""
    linear = [sub.weight for name, sub in module.named_modules()
              if isinstance(sub, nn.Linear) and weight_gemm("aten.linear", name)]
    experts = [p for name, p in module.named_parameters()
               if stored.experts and expert_weight(name, p.dim())]
    return linear + experts


def _reads_weights(kernel: Kernel) -> bool:
    """A kernel reading weights a mixed step shares (a linear layer's, a MoE layer's
    experts')."""
    return weight_gemm(kernel.target, kernel.module) or routed_experts(kernel.target)


def _reduced_by(stored: WeightFormat | None) -> Callable[[Kernel], bool]:
    """Which kernels read weights `stored` reduces: the linear layers' and, unless the
    format keeps them at 16 bits, the experts'."""
    def reduced(kernel: Kernel) -> bool:
        return weight_gemm(kernel.target, kernel.module) or bool(
            stored is not None and stored.experts and routed_experts(kernel.target))
    return reduced


def _reads_cache(kernel: Kernel) -> bool:
    return cache_attention(kernel.target)


def _element_bytes(module: nn.Module) -> int:
    return next(p.element_size() for p in module.parameters() if p.is_floating_point())


def _kernels(ctx: Context, graph: Graph, counted: Callable[[str], float], root: str,
             notes: list[str]) -> tuple[Kernel, ...]:
    """The fused kernels of one captured step, each weighted by the layers it stands for."""
    report = analyze(graph, ctx.registry)
    uncosted = [n.target for n in report.nodes if n.status in ("unsupported", "failed")]
    if uncosted:
        notes.append(f"{len(set(uncosted))} op kinds uncosted in the serving graphs "
                     f"({', '.join(sorted(set(uncosted))[:3])}): counted as zero")
    fused = fused_kernels(report, graph, kinds_of(list(graph.nodes), ctx.registry),
                          ctx.registry.lookup)
    return tuple(
        Kernel(n.target, n.module.removeprefix(root),
               dtype_key(node_dtype(graph.nodes[n.id], graph), ctx.options.tf32),
               n.kernel, float(n.flops), float(n.bytes_read + n.bytes_written),
               counted(n.module.removeprefix(root)), n.id)
        for n in fused.nodes if n.status == "costed")


def _layer_weights(layer_of: Callable[[str], int | None], standing_for: tuple[int, int]
                   ) -> Callable[[str], float]:
    """How many layers a kernel of the small model's module path stands for: a captured
    decoder layer's, the layers it `stands_for` (`layers_standing_for`: the second one per
    layer past the first, unless the first stands for k dense ones); every other kernel
    once."""
    def weight(path: str) -> float:
        index = layer_of(path)
        return 1.0 if index is None else float(standing_for[index])
    return weight


def _kv_groups(module: nn.Module, element_bytes: int) -> KVGroups:
    """K and V of one token, `element_bytes` per element, summed over the layers of each
    window (None: full attention)."""
    groups: dict[int | None, int] = {}
    for layer in layers_from_config(module.config):
        if layer.kind == "attention":
            groups[layer.window] = groups.get(layer.window, 0) + layer.kv_heads * (
                layer.k_head_dim + layer.v_head_dim) * element_bytes
    return tuple(sorted(groups.items(), key=lambda g: (g[0] is not None, g[0] or 0)))


def _windows(module: nn.Module, tokens: int, notes: list[str]) -> list[int | None]:
    """Each decoder layer's sliding window where one is narrower than `tokens`, else []."""
    windows = [layer.window for layer in layers_from_config(module.config)]
    narrow = [w for w in windows if w is not None and w < tokens]
    if not narrow:
        return []
    notes.append(f"sliding windows: {len(narrow)} of {len(windows)} layers attend to and "
                 f"cache at most {min(narrow)} tokens (TensorRT-LLM's cyclic KV cache, vLLM's "
                 f"sliding-window blocks); decode and prefill attention costed over the window")
    return windows


def _layer_index(small: nn.Module) -> Callable[[str], int | None]:
    """Which captured decoder layer (0 or 1) a kernel's module path is in, None outside."""
    stacks = [name for name, sub in small.named_modules()
              if isinstance(sub, nn.ModuleList) and name.endswith("layers")]
    layers = [f"{stacks[0]}.{index}" for index in (0, 1)] if stacks else []

    def layer_of(path: str) -> int | None:
        return next((index for index, layer in enumerate(layers)
                     if path == layer or path.startswith(layer + ".")), None)
    return layer_of


def _check_context(module: nn.Module, tokens: int) -> None:
    config = module.config
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and tokens > limit:
        raise LoadError(f"--serve: {tokens} tokens (--input-len + --output-len) exceed the "
                        f"model's context of {limit} (max_position_embeddings)")
