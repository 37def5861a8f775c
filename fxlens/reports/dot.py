"""Annotated graphviz: Report → DOT text, and DOT → SVG/PNG through the `dot` binary.

`render_dot` is pure and deterministic (node order is the report's, clusters in order of first
appearance, no timestamps): the same report gives the same bytes, which the goldens pin.

- Nodes are coloured on a 9-step heat scale (ColorBrewer YlOrRd) by one metric: ``flops``,
  ``bytes`` (read + written), ``time`` (the roofline section's estimate) or ``memory`` (live
  bytes right after the node, from the memory timeline). The scale is logarithmic between the
  smallest non-zero and the largest value shown; zero is grey.
- Labels: op (``aten.`` and ``.default`` dropped), first output shape and dtype, the metric.
- Modules become nested clusters; a module holding a single item gets no cluster of its own.
- Repeated blocks (`repeated_blocks`: children ``0…N-1`` of one parent, one type — the layers
  of a transformer) collapse into one summary node each, labelled with the op count and the
  sums of FLOPs and bytes over its nodes (the maximum for live memory); ``expand=True`` opens
  them. Every node carries ``id``/``URL`` (``n<node id>``, ``b<block index>``), so the SVG that
  graphviz writes can be linked back to the report by the HTML page.
- Edges carry the shape of the producer's first output; between collapsed blocks, parallel
  edges merge into one (the first one's label).

`Layout` runs `dot` as a process started at once and read later, by this process or a forked
child of it (`fxlens.cli.analyze` starts the pages' layouts as soon as the ops are costed);
`graphviz_render` is one layout read right away.

NB: summing node figures for a collapsed block is display aggregation, not a new metric.
Known limitation: graphviz's layout of an expanded graph with thousands of nodes takes tens of
seconds; the collapsed default stays small.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.graph import repeated_blocks
from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.reports.escape import dot_escape
from fxlens.reports.sections import node_memory, node_times
from fxlens.reports.units import binary_bytes, seconds, short_op, si

COLORS = ("flops", "bytes", "time", "memory")
PALETTE = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c",
           "#bd0026", "#800026")
ZERO_COLOR = "#eeeeee"
log = logging.getLogger(__name__)
SHARED_FANOUT = 3        # a tensor feeding this many blocks is drawn as shared
DOT_TIMEOUT_S = 300


def render_dot(report: Report, color: str = "flops", expand: bool = False,
               title: str | None = None) -> str:
    """The report's graph as DOT, coloured by `color`, repeated blocks collapsed unless
    `expand`. Raises ReportError for an unknown metric or one the report does not hold."""
    values = metric_values(report, color)
    layout = _layout(report, () if expand else collapsed_blocks(report))
    item_values = _item_values(report, layout, values, color)
    scale = _Scale(item_values.values())
    lines = [f'digraph "{dot_escape(report.model.name)}" {{',
             '  graph [newrank=true, rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, '
             'ranksep=0.35, labeljust=l, '
             f'label="{dot_escape(title or _title(report, color))}", labelloc=t];',
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9, '
             'penwidth=0.6];',
             '  edge [fontname="Helvetica", fontsize=7, color="#777777", arrowsize=0.5];']
    by_id = {n.id: n for n in report.nodes}
    lines += _cluster_lines(report, layout, by_id, item_values, scale, color)
    lines += _edge_lines(report, layout)
    lines.append("}")
    return "\n".join(lines) + "\n"


def collapsed_blocks(report: Report) -> tuple[str, ...]:
    """Module paths that collapse into one node each (in the report's module order)."""
    return repeated_blocks({m.path: m.type for m in report.modules})


def block_runs(report: Report) -> list[list[int]]:
    """Indices into `collapsed_blocks` grouped by run (the children of one parent)."""
    runs: dict[str, list[int]] = {}
    for index, block in enumerate(collapsed_blocks(report)):
        runs.setdefault(block.rpartition(".")[0], []).append(index)
    return list(runs.values())


def render_block_dot(report: Report, index: int, color: str = "flops") -> str:
    """Every op of collapsed block `index` as DOT: what its summary node stands for. The
    memory colouring reads a timeline of the whole graph, so a block is coloured by FLOPs."""
    block = collapsed_blocks(report)[index]
    inside = tuple(n for n in report.nodes if _block_of(n.module, (block,)) is not None)
    part = replace(report, nodes=inside, modules=tuple(
        m for m in report.modules if m.path == block or m.path.startswith(block + ".")))
    shown = "flops" if color == "memory" else color
    flops = sum(n.flops for n in inside)
    return render_dot(part, shown, expand=True, title=f"{block} · {len(inside)} ops · "
                      f"{si(flops, 'FLOP')} · coloured by {shown}")


def block_node_id(index: int) -> str:
    """The DOT/SVG id of the summary node of `collapsed_blocks(report)[index]`."""
    return f"b{index}"


def node_dot_id(node_id: int) -> str:
    return f"n{node_id}"


def metric_values(report: Report, color: str) -> dict[int, float]:
    """Per-node value of the colouring metric, read from the report."""
    if color == "flops":
        return {n.id: n.flops for n in report.nodes}
    if color == "bytes":
        return {n.id: n.bytes_read + n.bytes_written for n in report.nodes}
    if color == "time":
        times = node_times(report)
        if times is None:
            raise ReportError("--color time needs a roofline section in the report "
                              "(estimate times for a device first)")
        return {n.id: times.get(n.id, 0.0) for n in report.nodes}
    if color == "memory":
        live = node_memory(report)
        if live is None:
            raise ReportError("--color memory needs the memory section's timeline")
        return {n.id: float(v) for n, v in ((n, live[n.id]) for n in report.nodes)}
    raise ReportError(f"unknown colour metric {color!r}; choose one of {', '.join(COLORS)}")


def format_metric(value: float, color: str) -> str:
    if color == "flops":
        return si(value, "FLOP")
    if color == "time":
        return seconds(value)
    text = binary_bytes(value)
    return f"{text} live" if color == "memory" else text


def shape_text(node: NodeReport) -> str:
    if not node.outputs:
        return "—"
    first = node.outputs[0]
    shape = first.get("shape") if isinstance(first, Mapping) else None
    dims = "×".join(str(d) for d in shape) if shape else "scalar"
    more = f" (+{len(node.outputs) - 1})" if len(node.outputs) > 1 else ""
    return f"{dims} {first.get('dtype', '')}".rstrip() + more


# --- layout: which item each node becomes, and which cluster holds it -------------------------


@dataclass
class _Layout:
    item_of: dict[int, str]                      # node id → DOT item id
    items: list[str] = field(default_factory=list)   # item ids in first-appearance order
    module_of: dict[str, str] = field(default_factory=dict)   # item id → module path
    block_nodes: dict[str, list[NodeReport]] = field(default_factory=dict)
    block_path: dict[str, str] = field(default_factory=dict)


def _layout(report: Report, blocks: tuple[str, ...]) -> _Layout:
    layout = _Layout(item_of={})
    for node in report.nodes:
        block = _block_of(node.module, blocks)
        if block is None:
            item, module = node_dot_id(node.id), node.module
        else:
            item = block_node_id(blocks.index(block))
            module = block.rpartition(".")[0]
            layout.block_nodes.setdefault(item, []).append(node)
            layout.block_path[item] = block
        layout.item_of[node.id] = item
        if item not in layout.module_of:
            layout.items.append(item)
            layout.module_of[item] = module
    return layout


def _block_of(module: str, blocks: tuple[str, ...]) -> str | None:
    for block in blocks:
        if module == block or module.startswith(block + "."):
            return block
    return None


def _item_values(report: Report, layout: _Layout, values: Mapping[int, float],
                 color: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for node in report.nodes:
        item = layout.item_of[node.id]
        value = values.get(node.id, 0.0)
        previous = out.get(item, 0.0)
        out[item] = max(previous, value) if color == "memory" else previous + value
    return out


class _Scale:
    """Log-scaled bucket of a value among the values shown."""

    def __init__(self, values: Iterable[float]) -> None:
        positive = [v for v in values if v > 0]
        self.low = math.log10(min(positive)) if positive else 0.0
        self.high = math.log10(max(positive)) if positive else 0.0

    def level(self, value: float) -> int | None:
        if value <= 0:
            return None
        if self.high <= self.low:
            return len(PALETTE) - 1
        t = (math.log10(value) - self.low) / (self.high - self.low)
        return min(len(PALETTE) - 1, max(0, int(t * len(PALETTE))))


# --- emission --------------------------------------------------------------------------------


def _cluster_lines(report: Report, layout: _Layout, by_id: Mapping[int, NodeReport],
                   item_values: Mapping[str, float], scale: _Scale, color: str) -> list[str]:
    """Nodes inside nested module clusters, emitted depth-first without recursion."""
    types = {m.path: m.type for m in report.modules}
    cluster_of = _clusters(layout)
    children: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    for item in layout.items:
        members.setdefault(cluster_of[item], []).append(item)
    for path in _ordered_clusters(layout, cluster_of):
        children.setdefault(_parent_cluster(path, set(cluster_of.values())), []).append(path)
    lines: list[str] = []
    counter = 0
    stack: list[tuple[str, bool, int]] = [("", False, 1)]
    while stack:
        path, closing, depth = stack.pop()
        indent = "  " * depth
        if closing:
            lines.append(indent + "}")
            continue
        if path:
            counter += 1
            label = f"{path} · {types.get(path, '').rsplit('.', 1)[-1]}"
            lines += [f'{indent}subgraph "cluster_{counter}" {{',
                      f'{indent}  label="{dot_escape(label)}"; style="rounded"; '
                      'color="#bbbbbb"; fontsize=9;']
            stack.append((path, True, depth))
            indent += "  "
        for item in members.get(path, []):
            lines.append(indent + _item_line(item, layout, by_id, item_values, scale,
                                                      color, types))
        inner = depth + 1 if path else depth
        stack.extend((child, False, inner) for child in reversed(children.get(path, [])))
    return lines


def _clusters(layout: _Layout) -> dict[str, str]:
    """Item → the deepest enclosing module that holds at least two items (or the root)."""
    counts: dict[str, int] = {}
    for item in layout.items:
        path = layout.module_of[item]
        while path:
            counts[path] = counts.get(path, 0) + 1
            path = path.rpartition(".")[0]
    cluster_of: dict[str, str] = {}
    for item in layout.items:
        path = layout.module_of[item]
        while path and counts.get(path, 0) < 2:
            path = path.rpartition(".")[0]
        cluster_of[item] = path
    return cluster_of


def _ordered_clusters(layout: _Layout, cluster_of: Mapping[str, str]) -> list[str]:
    """Every non-root cluster, with the emitted ancestors it needs, in first-appearance order."""
    used = set(cluster_of.values())
    ordered: list[str] = []
    for item in layout.items:
        path = cluster_of[item]
        chain = []
        while path:
            if path in used:
                chain.append(path)
            path = path.rpartition(".")[0]
        ordered += [p for p in reversed(chain) if p not in ordered]
    return ordered


def _parent_cluster(path: str, used: set[str]) -> str:
    parent = path.rpartition(".")[0]
    while parent and parent not in used:
        parent = parent.rpartition(".")[0]
    return parent


def _item_line(item: str, layout: _Layout, by_id: Mapping[int, NodeReport],
               item_values: Mapping[str, float], scale: _Scale, color: str,
               types: Mapping[str, str]) -> str:
    value = item_values.get(item, 0.0)
    level = scale.level(value)
    fill = ZERO_COLOR if level is None else PALETTE[level]
    font = "#ffffff" if level is not None and level >= 6 else "#000000"
    if item in layout.block_nodes:
        path = layout.block_path[item]
        nodes = layout.block_nodes[item]
        label_lines = [f"{path} · {types.get(path, '').rsplit('.', 1)[-1]}",
                       f"{len(nodes)} ops (collapsed)",
                       f"{si(sum(n.flops for n in nodes), 'FLOP')} · "
                       f"{binary_bytes(sum(n.bytes_read + n.bytes_written for n in nodes))}"]
        if color not in ("flops", "bytes"):
            label_lines.append(format_metric(value, color))
        tooltip = f"{path}: {len(nodes)} ops; --expand to open"
        shape = ', shape=box3d, style="filled"'
    else:
        node = by_id[int(item[1:])]
        label_lines = [short_op(node.target), shape_text(node), format_metric(value, color)]
        tooltip = f"{node.module or '(root)'} · {node.source}"
        shape = ""
    label = "\n".join(label_lines)
    return (f'{item} [id="{item}", URL="#{item}", label="{dot_escape(label)}", '
            f'tooltip="{dot_escape(tooltip)}", fillcolor="{fill}", fontcolor="{font}"{shape}];')


def _edge_lines(report: Report, layout: _Layout) -> list[str]:
    """One edge per (source item, destination item); a tensor outside the blocks that feeds
    `SHARED_FANOUT` or more collapsed blocks (a mask, rotary tables) is drawn once, dashed, to
    the first of them and labelled with the count, not as a curtain of edges to every layer."""
    by_id = {n.id: n for n in report.nodes}
    pairs: dict[tuple[str, str], int] = {}          # (src, dst) → first source node id
    for node in report.nodes:
        dst = layout.item_of[node.id]
        for source in node.inputs:
            if source not in by_id:
                continue            # parameters, buffers and graph inputs are not drawn
            src = layout.item_of[source]
            if src != dst:
                pairs.setdefault((src, dst), source)
    fans: dict[str, list[str]] = {}
    for src, dst in pairs:
        if dst in layout.block_path and src not in layout.block_path:
            fans.setdefault(src, []).append(dst)
    lines: list[str] = []
    for (src, dst), source in pairs.items():
        label = dot_escape(shape_text(by_id[source]).split(" (")[0])
        shared = fans.get(src, [])
        if len(shared) >= SHARED_FANOUT and dst in shared:
            if dst == shared[0]:
                lines.append(f'  {src} -> {dst} [label="{label} → {len(shared)} blocks", '
                             'style=dashed];')
            continue
        lines.append(f'  {src} -> {dst} [label="{label}"];')
    return lines


def _title(report: Report, color: str) -> str:
    return (f"{report.model.name} · coloured by {color} · "
            f"{si(report.totals.flops, 'FLOP')} forward")


# --- graphviz --------------------------------------------------------------------------------


def dot_binary() -> str | None:
    """Path of graphviz's `dot`, or None when it is not installed."""
    return shutil.which("dot")


def graphviz_render(dot_source: str, fmt: str = "svg", timeout_s: float = DOT_TIMEOUT_S) -> bytes:
    """Run `dot -T<fmt>` on `dot_source`. Raises ReportError when dot is missing, fails or
    takes longer than `timeout_s`."""
    layout = Layout(dot_source, fmt, timeout_s)
    try:
        return layout.result()
    finally:
        layout.close()


def _limited(command: list[str], seconds: float) -> list[str]:
    """`command` under a CPU-time limit of `seconds` (whole, at least 1) and no core file,
    through the POSIX shell; as it is where there is none. A shell that refuses a limit
    still runs the command."""
    shell = shutil.which("sh")
    if shell is None:
        return command
    script = 'ulimit -c 0 2>/dev/null; ulimit -t "$1" 2>/dev/null; shift; exec "$@"'
    return [shell, "-c", script, "sh", str(max(1, math.ceil(seconds))), *command]


class Layout:
    """`dot -T<fmt>` on `source`, started now; `result()` gives what it wrote (as
    `graphviz_render` returns it), waiting for it at most until `timeout_s` after the start.

    The output comes through a pipe and dot's messages go to a temporary file, so a forked
    child of this process can read the result too (`fxlens.cli.analyze` starts the layouts
    as soon as the ops are costed and writes the pages in a child). There dot is not its
    child and its exit status is out of reach (``wait`` reads 0): an SVG that dot left
    without its closing tag (a crash halfway) is a failure too.

    Nobody may read a layout until long after its budget (the passes of an analysis run
    between its start and the pages), so dot also runs under a CPU-time limit of the budget
    (``ulimit -t``, where a POSIX shell is there): a layout that cannot finish stops taking
    a core from the analysis when its budget is spent, not when it is read."""

    def __init__(self, source: str, fmt: str = "svg", timeout_s: float = DOT_TIMEOUT_S) -> None:
        binary = dot_binary()
        if binary is None:
            raise ReportError("graphviz's `dot` is not installed (apt-get install graphviz); "
                              "the .dot file was still written")
        self.source, self.fmt, self.timeout_s = source, fmt, timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._messages = tempfile.TemporaryFile()   # noqa: SIM115 - closed by close()
        self._process = subprocess.Popen(_limited([binary, f"-T{fmt}"], timeout_s),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._messages)
        self._output: bytes | None = None
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError):   # dot stopped reading: its messages say
            self._process.stdin.write(source.encode())
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.close()
        self._process.stdin = None      # written and closed: `communicate` leaves it alone

    def result(self) -> bytes:
        if self._output is None:
            self._output = self._read()
        return self._output

    def _read(self) -> bytes:
        """The output, read as it comes: what dot already wrote is taken even past the
        budget (dot writes it all at the end of its layout, so a first chunk means it made
        it in time); nothing by the deadline is a layout over its budget."""
        assert self._process.stdout is not None
        if not hasattr(select, "poll"):   # Windows: no fork there, so dot is our child
            return self._communicate()
        pipe = self._process.stdout.fileno()
        ready = select.poll()
        ready.register(pipe, select.POLLIN)
        chunks: list[bytes] = []
        while True:
            wait_s = max(self._deadline - time.monotonic(), 0.0) if not chunks else 10.0
            if not ready.poll(wait_s * 1000):
                self._kill()
                raise self._over_budget()
            chunk = os.read(pipe, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return self._checked(b"".join(chunks), self._process.wait())

    def _communicate(self) -> bytes:
        try:
            output, _ = self._process.communicate(
                timeout=max(self._deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            self._kill()
            raise self._over_budget() from None
        return self._checked(output, self._process.returncode)

    def _checked(self, output: bytes, code: int) -> bytes:
        """`output` if dot ended well: exit status 0 and, for an SVG, its closing tag."""
        if code != 0 or (self.fmt == "svg" and not output.rstrip().endswith(b"</svg>")):
            self._messages.seek(0)
            stderr = self._messages.read().decode(errors="replace").strip()
            log.debug("dot -T%s stderr:\n%s", self.fmt, stderr)
            if code < 0 or not stderr:   # killed at its CPU limit, or cut short silently
                raise self._over_budget()
            first = stderr.splitlines()[0]
            raise ReportError(f"dot -T{self.fmt} failed: {first[:120]} (--debug for "
                              "graphviz's output)")
        return output

    def _over_budget(self) -> ReportError:
        return ReportError(f"dot -T{self.fmt} took over {self.timeout_s:g} s on this graph")

    def _kill(self) -> None:
        """Not `Popen.kill`, which sends nothing where dot is not this process's child."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process.pid, getattr(signal, "SIGKILL", signal.SIGTERM))

    def close(self) -> None:
        """Stop dot if it still runs, reap it where it is this process's child, and close
        the pipe and the file."""
        if self._process.poll() is None:
            self._kill()
        self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._messages.close()
