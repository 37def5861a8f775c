"""A selective-checkpointing policy as Python a user pastes: `policy_code(policies, names)`.

The code is torch's own API (``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=False``
and ``context_fn=`` a ``create_selective_checkpoint_contexts`` of a policy function): per group
of alike blocks, a table of the ops to save — all their calls in a block's forward, or the
listed ones (0-based, counted per op as the policy sees them) — a policy function returning
``MUST_SAVE`` for those and ``PREFER_RECOMPUTE`` for the rest, and each block's ``forward``
wrapped. The counters live in ``context_fn``, so each block's forward counts from 0; torch
calls the policy in the forward only (the recompute replays the decisions).
`tests/analyzer/test_checkpoint.py` runs this code on real models.

`module_code(policies)`: the module granularity's (`fxlens.analyzer.checkpoint.modules`) —
each recomputed child of each block wrapped in ``checkpoint(…, use_reentrant=False)``, no
policy function; `tests/analyzer/test_checkpoint_modules.py` runs it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Sequence

from fxlens.analyzer.core.sections import BlockPolicy

HEADER = '''import collections
import functools

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

ALL = range(1 << 30)   # every call of the op


def selective(save):
    """A context_fn for checkpoint(): MUST_SAVE the calls `save` names."""
    def context_fn():
        calls = collections.Counter()

        def policy_fn(ctx, op, *args, **kwargs):
            index = calls[op]
            calls[op] += 1
            if index in save.get(op, ()):
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy_fn)
    return context_fn


def checkpointed(block, context_fn):
    """Run `block`'s forward under selective activation checkpointing."""
    forward = block.forward

    @functools.wraps(forward)
    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=context_fn, **kwargs)

    block.forward = run
'''


def policy_code(policies: Sequence[BlockPolicy], runtime_ops: Callable[[str], tuple[str, ...]],
                model: str = "model") -> str:
    """The code applying `policies` to `model` (the name of the user's module)."""
    parts = [HEADER]
    for i, policy in enumerate(policies):
        name = "SAVE" if len(policies) == 1 else f"SAVE_{i}"
        rows = []
        for op in policy.saved:
            calls = "ALL" if op.every else "{" + ", ".join(map(str, op.calls)) + "}"
            rows += [f"    {_op(target)}: {calls}," for target in runtime_ops(op.target)]
        comment = textwrap.wrap(f"{_blocks_text(policy.blocks)}: {policy.summary}", 74)
        parts.append("\n" + "".join(f"# {line}\n" for line in comment))
        parts.append(f"{name} = {{\n" + "".join(f"{row}\n" for row in rows) + "}\n"
                     if rows else f"{name} = {{}}\n")
        parts.append(f"for path in {_paths(policy.blocks)}:\n"
                     f"    checkpointed({model}.get_submodule(path), selective({name}))\n")
    return "".join(parts)


def _op(target: str) -> str:
    return "torch.ops." + target


def _blocks_text(blocks: Sequence[str]) -> str:
    """The blocks in a comment: names come from user code, so escaped to one line."""
    first = json.dumps(blocks[0])[1:-1]
    return first if len(blocks) == 1 else f"{len(blocks)} blocks ({first} …)"


def _paths(blocks: Sequence[str]) -> str:
    """``["model.layers." + str(i) for i in range(32)]`` for a whole run, else the paths;
    string literals by `json.dumps`, valid Python whatever the module names hold."""
    parent, _, _ = blocks[0].rpartition(".")
    indices = [b.rpartition(".")[2] for b in blocks]
    start = int(indices[0]) if indices[0].isdigit() else -1
    if (start >= 0 and len(blocks) > 2 and all(b.rpartition(".")[0] == parent for b in blocks)
            and indices == [str(i) for i in range(start, start + len(blocks))]):
        span = f"range({start}, {start + len(blocks)})" if start else f"range({len(blocks)})"
        prefix = json.dumps(f"{parent}." if parent else "")
        return f"[{prefix} + str(i) for i in {span}]"
    return "(" + ", ".join(json.dumps(b) for b in blocks) + ("," if len(blocks) == 1 else "") + ")"


MODULE_HEADER = '''import functools

from torch.utils.checkpoint import checkpoint


def checkpointed(module):
    """Recompute `module`'s forward in the backward instead of keeping its activations."""
    forward = module.forward

    @functools.wraps(forward)
    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = run
'''


def module_code(policies: Sequence[BlockPolicy], model: str = "model") -> str:
    """The code wrapping each policy's recomputed children (`BlockPolicy.modules`) of its
    blocks in `model` (the name of the user's module)."""
    parts = [MODULE_HEADER]
    for i, policy in enumerate(policies):
        if not policy.modules:
            continue
        name = "WRAP" if len(policies) == 1 else f"WRAP_{i}"
        summary = json.dumps(policy.summary)[1:-1]      # child names come from user code
        comment = textwrap.wrap(f"{_blocks_text(policy.blocks)}: {summary}", 74)
        parts.append("\n" + "".join(f"# {line}\n" for line in comment))
        names = ", ".join(json.dumps(m) for m in policy.modules)
        parts.append(f"{name} = ({names}{',' if len(policy.modules) == 1 else ''})\n")
        parts.append(f"for path in {_paths(policy.blocks)}:\n"
                     f"    for child in {name}:\n"
                     f"        checkpointed({model}.get_submodule(path + \".\" + child))\n")
    return "".join(parts)
