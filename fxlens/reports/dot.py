"""Annotated graphviz: Report → DOT text, and DOT → SVG/PNG through the `dot` binary.

`render_dot` is pure and deterministic (node order is the report's, clusters in order of first
appearance, no timestamps): the same report gives the same bytes, which the goldens pin.

- What is drawn (`fxlens.reports.graph_groups.plan_graph`): each op a node, except runs of
  alike repeated blocks, one node each (``model.layers.0–31 ×32 · LlamaDecoderLayer``, ops,
  FLOPs and bytes each and in all), the cheap ops that only build inputs before the first
  block, folded into one node ``inputs & plumbing: N ops``, and asserts, not drawn at all.
  ``expand=True`` draws every op (asserts still hidden). Every node carries ``id``/``URL``
  (``n<node id>``, a run ``b<index of its first block>``, the fold ``p0``), so the SVG that
  graphviz writes can be linked back to the report by the HTML page.
- Colour (`fxlens.reports.graph_legend`): one metric, ``flops``, ``bytes`` (read + written),
  ``time`` (the roofline section's estimate) or ``memory`` (live bytes right after the op,
  from the memory timeline), on a LINEAR 9-bin scale (ColorBrewer YlOrRd) from 0 to the
  largest value among the nodes drawn; exactly zero is grey. A run or a fold is worth its
  ops' sum (live memory: their maximum). A legend node (``id="legend"``) lists the bins with
  their ranges in the metric's units.
- Labels: op (``aten.`` and ``.default`` dropped), first output shape and dtype, the metric;
  module types by class name alone.
- Modules become nested clusters; a module holding a single item gets no cluster of its own.
- Edges carry the shape of the producer's first output; parallel edges between two nodes
  merge into one (the first one's label), edges through a hidden op are bridged, and a tensor
  that feeds `SHARED_FANOUT` or more blocks is one dashed edge labelled with the count.

`Layout` runs `dot` as a process started at once and read later, by this process or a forked
child of it (`fxlens.cli.analyze` starts the pages' layouts as soon as the ops are costed);
`graphviz_render` is one layout read right away.

NB: summing node figures for a run or a fold is display aggregation, not a new metric.
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
from collections.abc import Mapping
from dataclasses import replace

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.reports.escape import dot_escape, html_escape
from fxlens.reports.graph_groups import (
    FOLD_ID,
    FOLD_TITLE,
    FOLD_WHY,
    BlockRun,
    GraphPlan,
    clusters,
    collapsed_blocks,
    plan_graph,
    short_type,
)
from fxlens.reports.graph_legend import Legend, Scale, format_metric, legend, metric_values
from fxlens.reports.units import binary_bytes, short_op, si

log = logging.getLogger(__name__)
SHARED_FANOUT = 3        # a tensor feeding this many blocks is drawn as shared
FOLD_NAMES = 5           # op names the fold's label lists
DOT_TIMEOUT_S = 300


def render_dot(report: Report, color: str = "flops", expand: bool = False,
               title: str | None = None) -> str:
    """The report's graph as DOT, coloured by `color`, runs of blocks and the input plumbing
    folded unless `expand`. Raises ReportError for an unknown metric or one the report does
    not hold."""
    plan = plan_graph(report, expand)
    values = _item_values(report, plan, metric_values(report, color), color)
    scale = Scale.of(values.values())
    lines = [f'digraph "{dot_escape(report.model.name)}" {{',
             '  graph [newrank=true, rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, '
             'ranksep=0.35, labeljust=l, '
             f'label="{dot_escape(title or _title(report, color))}", labelloc=t];',
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9, '
             'penwidth=0.6];',
             '  edge [fontname="Helvetica", fontsize=7, color="#777777", arrowsize=0.5];']
    lines += _cluster_lines(report, plan, values, scale, color)
    lines += _edge_lines(report, plan)
    lines += _legend_lines(legend(scale, color))
    lines.append("}")
    return "\n".join(lines) + "\n"


def dot_legend(report: Report, color: str = "flops", expand: bool = False,
               block: int | None = None) -> Legend:
    """The legend of `render_dot(report, color, expand)`'s colours, for the HTML page; with
    `block`, of `render_block_dot(report, block, color)`'s."""
    if block is not None:
        report, color, expand = *_block_part(report, block, color), True
    plan = plan_graph(report, expand)
    return legend(Scale.of(_item_values(report, plan, metric_values(report, color),
                                        color).values()), color)


def render_block_dot(report: Report, index: int, color: str = "flops") -> str:
    """Every op of block `collapsed_blocks(report)[index]` as DOT: what a run's node stands
    for. The memory colouring reads a timeline of the whole graph, so a block is coloured
    by FLOPs."""
    part, shown = _block_part(report, index, color)
    flops = sum(n.flops for n in part.nodes)
    return render_dot(part, shown, expand=True, title=f"{collapsed_blocks(report)[index]} · "
                      f"{len(part.nodes)} ops · {si(flops, 'FLOP')} · coloured by {shown}")


def _block_part(report: Report, index: int, color: str) -> tuple[Report, str]:
    """The report of block `index` alone and the metric it is coloured by."""
    block = collapsed_blocks(report)[index]
    inside = tuple(n for n in report.nodes if block in ancestors(n.module))
    part = replace(report, nodes=inside, modules=tuple(
        m for m in report.modules if m.path == block or m.path.startswith(block + ".")))
    return part, "flops" if color == "memory" else color


def shape_text(node: NodeReport) -> str:
    if not node.outputs:
        return "—"
    first = node.outputs[0]
    shape = first.get("shape") if isinstance(first, Mapping) else None
    dims = "×".join(str(d) for d in shape) if shape else "scalar"
    more = f" (+{len(node.outputs) - 1})" if len(node.outputs) > 1 else ""
    return f"{dims} {first.get('dtype', '')}".rstrip() + more


def _item_values(report: Report, plan: GraphPlan, values: Mapping[int, float],
                 color: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for node in report.nodes:
        item = plan.item_of.get(node.id)
        if item is None:
            continue
        value, previous = values.get(node.id, 0.0), out.get(item, 0.0)
        out[item] = max(previous, value) if color == "memory" else previous + value
    return out


# --- emission --------------------------------------------------------------------------------


def _cluster_lines(report: Report, plan: GraphPlan, values: Mapping[str, float], scale: Scale,
                   color: str) -> list[str]:
    """Nodes inside nested module clusters, emitted depth-first without recursion."""
    types = {m.path: m.type for m in report.modules}
    by_id = {n.id: n for n in report.nodes}
    cluster_of, children = clusters(plan)
    members: dict[str, list[str]] = {}
    for item in plan.items:
        members.setdefault(cluster_of[item], []).append(item)
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
            label = f"{path} · {short_type(types.get(path, ''))}"
            lines += [f'{indent}subgraph "cluster_{counter}" {{',
                      f'{indent}  label="{dot_escape(label)}"; style="rounded"; '
                      'color="#bbbbbb"; fontsize=9;']
            stack.append((path, True, depth))
            indent += "  "
        for item in members.get(path, []):
            value = values.get(item, 0.0)
            lines.append(indent + _item_line(item, _item_text(item, plan, by_id, value, color),
                                             scale, value))
        inner = depth + 1 if path else depth
        stack.extend((child, False, inner) for child in reversed(children.get(path, [])))
    return lines


def _item_text(item: str, plan: GraphPlan, by_id: Mapping[int, NodeReport], value: float,
               color: str) -> tuple[list[str], str, str]:
    """(label lines, tooltip, extra attributes) of one drawn item."""
    if item in plan.runs:
        return _run_text(plan.runs[item], value, color)
    if item == FOLD_ID:
        return _fold_text(plan.folded, value, color)
    node = by_id[int(item[1:])]
    return ([short_op(node.target), shape_text(node), format_metric(value, color)],
            f"{node.module or '(root)'} · {node.source}", "")


def _item_line(item: str, text: tuple[list[str], str, str], scale: Scale, value: float) -> str:
    label, tooltip, extra = text
    return (f'{item} [id="{item}", URL="#{item}", label="{dot_escape(chr(10).join(label))}", '
            f'tooltip="{dot_escape(tooltip)}", fillcolor="{scale.fill(value)}", '
            f'fontcolor="{scale.font(value)}"{extra}];')


def _run_text(run: BlockRun, value: float, color: str) -> tuple[list[str], str, str]:
    """``model.layers.0–31 ×32 · LlamaDecoderLayer``, one block's figures and the run's."""
    m, count = run.module, run.count
    moved = m.bytes_read + m.bytes_written
    lines = [f"{run.label} · {short_type(m.type)}",
             f"{m.nodes} ops · {si(m.flops, 'FLOP')} · {binary_bytes(moved)}"
             + (" each" if count > 1 else "")]
    if count > 1:
        lines.append(f"{si(m.flops * count, 'FLOP')} · {binary_bytes(moved * count)} in all")
    if color == "time":
        lines.append(format_metric(value, color) + (" in all" if count > 1 else ""))
    elif color == "memory":
        lines.append(f"at most {format_metric(value, color)}")
    what = f"{count} alike blocks, {m.nodes} ops each" if count > 1 else f"{m.nodes} ops"
    return lines, f"{run.label}: {what}; --expand draws every op", ', shape=box3d, style="filled"'


def _fold_text(nodes: tuple[NodeReport, ...], value: float, color: str
               ) -> tuple[list[str], str, str]:
    names = list(dict.fromkeys(short_op(n.target).partition(".")[0] for n in nodes))
    shown = ", ".join(names[:FOLD_NAMES]) + (", …" if len(names) > FOLD_NAMES else "")
    flops = sum(n.flops for n in nodes)
    moved = sum(n.bytes_read + n.bytes_written for n in nodes)
    lines = [f"{FOLD_TITLE}: {len(nodes)} ops", shown,
             f"{si(flops, 'FLOP')} · {binary_bytes(moved)}"]
    if color in ("time", "memory"):
        lines.append(format_metric(value, color))
    return lines, f"{len(nodes)} {FOLD_WHY}; --expand draws them", ', shape=folder, style="filled"'


def _edge_lines(report: Report, plan: GraphPlan) -> list[str]:
    """One edge per (source item, destination item), through hidden ops to their inputs; a
    tensor from outside the blocks that feeds `SHARED_FANOUT` or more blocks (a mask, rotary
    tables) is drawn once, dashed, to the first of them and labelled with the count, not as a
    curtain of edges to every run."""
    by_id = {n.id: n for n in report.nodes}
    pairs: dict[tuple[str, str], int] = {}          # (src, dst) → first source node id
    fed: dict[str, set[str]] = {}                   # item outside the blocks → blocks it feeds
    for node in report.nodes:
        dst = plan.item_of.get(node.id)
        if dst is None:
            continue
        for source in _sources(node, by_id, plan.hidden):
            src = plan.item_of[source]
            if src != dst:
                pairs.setdefault((src, dst), source)
                if node.id in plan.block_of and src not in plan.runs:
                    fed.setdefault(src, set()).add(plan.block_of[node.id])
    lines: list[str] = []
    shared_drawn: set[str] = set()
    for (src, dst), source in pairs.items():
        label = dot_escape(shape_text(by_id[source]).split(" (")[0])
        blocks = len(fed.get(src, ()))
        if dst in plan.runs and blocks >= SHARED_FANOUT:
            if src not in shared_drawn:
                shared_drawn.add(src)
                lines.append(f'  {src} -> {dst} [label="{label} → {blocks} blocks", '
                             'style=dashed];')
            continue
        lines.append(f'  {src} -> {dst} [label="{label}"];')
    return lines


def _sources(node: NodeReport, by_id: Mapping[int, NodeReport], hidden: frozenset[int]
             ) -> list[int]:
    """The drawn producers of `node`'s inputs: a hidden op stands for its own inputs;
    parameters, buffers and graph inputs are not drawn."""
    found: list[int] = []
    stack, seen = list(reversed(node.inputs)), set()
    while stack:
        source = stack.pop()
        if source in seen or source not in by_id:
            continue
        seen.add(source)
        if source in hidden:
            stack.extend(reversed(by_id[source].inputs))
        else:
            found.append(source)
    return found


def _legend_lines(shown: Legend) -> list[str]:
    """The legend as one node with a table (graphviz's HTML-like label, so its text is
    XML-escaped, not DOT-escaped)."""
    rows = "".join(f'<tr><td bgcolor="{b.color}" width="18" height="10" fixedsize="true" '
                   f'border="1" color="#999999"> </td><td align="left">{html_escape(b.text)}'
                   "</td></tr>" for b in shown.bins)
    table = ('<table border="0" cellborder="0" cellspacing="1" cellpadding="1">'
             f'<tr><td colspan="2" align="left"><b>{html_escape(shown.title)}</b></td></tr>'
             f'{rows}<tr><td colspan="2" align="left">{html_escape(shown.note)}</td></tr>'
             "</table>")
    return [f'  legend [id="legend", shape=plaintext, style="", margin=0, fontsize=8, '
            f'tooltip="{dot_escape(shown.title)}", label=<{table}>];']


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
