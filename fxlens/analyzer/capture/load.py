"""`load(target) -> LoadedModel`: turn what the user typed into a module and example inputs.

Targets:
  path/to/model.py        calls ``build()`` (or ``--entry NAME``), or reads module-level
                          ``model`` and ``example_inputs``
  pkg.module:function     imports the module and calls the function
  hf:<preset>             a shipped `transformers` config on the meta device
                          (`fxlens.analyzer.capture.hf`)

A factory returns ``(module, example_inputs)``; example inputs are a tuple of positional
arguments, a dict of keyword arguments, or a single tensor. Sizes from the command line
(``batch``, ``seq_len``, ``image_size``) are passed to a factory that declares parameters of
those names (or ``**kwargs``); a factory that does not is called without them. A model file
(or factory module) may define ``calibration()`` yielding input batches for ``--calibrate``,
and ``evaluate(model)`` returning the task's metrics (``{"accuracy": 0.973}``), which the
quantization section runs on the model quantized (`fxlens.analyzer.quant.task`).

Every failure is a `LoadError` naming the file (and line, for errors inside user code). User
code runs under `fxlens.analyzer.capture.guard.user_code`: a model file that calls
``sys.exit`` or raises a `BaseException` is a `LoadError` too (exit 2), never the process's
end; example inputs are checked (`check_inputs`) before any capture.
Loading leaves the process as it found it: a model file is in `sys.modules` (as
``fxlens_user_<stem>``, a name no report shows: `fx_convert.type_name` drops it) and its folder
on `sys.path` only while its code runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import math
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture.fx_convert import USER_MODULE_PREFIX, user_frame
from fxlens.analyzer.capture.guard import user_code
from fxlens.analyzer.capture.target import check_target
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.loaded import LoadedModel

DEFAULT_ENTRY = "build"


def load(
    target: str,
    entry: str | None = None,
    overrides: Mapping[str, str] | None = None,
    sizes: Mapping[str, int | None] | None = None,
    allow_large: bool = False,
) -> LoadedModel:
    given: dict[str, int] = {k: v for k, v in (sizes or {}).items() if v is not None}
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LoadError(f"--{key.replace('_', '-')} must be at least 1, got {value!r}")
    if target.startswith("hf:"):
        from fxlens.analyzer.capture.hf import load_preset

        return load_preset(target[3:], overrides or {}, batch=given.get("batch", 1),
                           seq_len=given.get("seq_len"), image_size=given.get("image_size"),
                           allow_large=allow_large)
    check_target(target, overrides)
    if target.endswith(".py"):
        return _from_file(Path(target), entry, given)
    module_name, _, function = target.partition(":")
    return _from_factory(_import(module_name), function, given, module_name)


def _from_file(path: Path, entry: str | None, sizes: Mapping[str, int]) -> LoadedModel:
    if not path.exists():
        raise LoadError(f"model file not found: {path}")
    if not path.is_file():
        raise LoadError(f"{path} is not a regular file (a folder, FIFO or device); expected "
                        f"a model .py file")
    spec = importlib.util.spec_from_file_location(f"{USER_MODULE_PREFIX}{path.stem}", path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path} cannot be imported as a Python module")
    code = importlib.util.module_from_spec(spec)
    with _running_user_file(spec.name, code, path.resolve().parent):
        try:
            with user_code(f"importing {path}"):
                spec.loader.exec_module(code)
        except SyntaxError as error:   # also null bytes and text that is not UTF-8
            line = f":{error.lineno}" if error.lineno else ""
            raise LoadError(f"syntax error in {path}{line}: {error.msg}") from error
        except LoadError:
            raise
        except Exception as error:
            raise LoadError(_user_error(f"importing {path} failed", error)) from error
        if entry is None and not hasattr(code, DEFAULT_ENTRY) and hasattr(code, "model"):
            if not hasattr(code, "example_inputs"):
                raise LoadError(f"{path} defines `model` but no `example_inputs`")
            return _loaded(code.model, code.example_inputs, path.stem, str(path),
                           _hooks(code))
        return _from_factory(code, entry or DEFAULT_ENTRY, sizes, str(path))


@contextlib.contextmanager
def _running_user_file(name: str, code: ModuleType, folder: Path) -> Iterator[None]:
    """While a model file's code runs (its import, then its factory): registered in
    `sys.modules` as `import` would (dataclasses and pickling look it up there), its folder
    first on `sys.path` (sibling imports). Both are undone afterwards, a name loaded before
    restored: the model reaches its module's globals through its functions' ``__globals__``,
    so tracing it later does not need the entry."""
    previous = sys.modules.get(name)
    sys.modules[name] = code
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        if sys.modules.get(name) is code:
            del sys.modules[name]
        if previous is not None:
            sys.modules[name] = previous


def _import(module_name: str) -> Any:
    try:
        with user_code(f"importing {module_name}"):
            return importlib.import_module(module_name)
    except LoadError:
        raise
    except ImportError as error:
        raise LoadError(f"cannot import {module_name!r}: {error}") from error
    except Exception as error:
        raise LoadError(_user_error(f"importing {module_name} failed", error)) from error


def _from_factory(code: Any, name: str, sizes: Mapping[str, int], where: str) -> LoadedModel:
    factory = getattr(code, name, None)
    if not callable(factory):
        hint = "" if name != DEFAULT_ENTRY else " (or module-level `model` and `example_inputs`)"
        raise LoadError(f"{where} has no function `{name}()`{hint}; name another with --entry")
    try:
        with user_code(f"{where}: {name}()"):
            result = factory(**_accepted(factory, sizes))
    except LoadError:
        raise
    except Exception as error:
        raise LoadError(_user_error(f"{where}: {name}() raised", error)) from error
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise LoadError(f"{where}: {name}() must return (module, example_inputs)")
    module, inputs = result
    stem = Path(where).stem if where.endswith(".py") else where.rsplit(".", 1)[-1]
    loaded = _loaded(module, inputs, f"{stem}:{name}" if name != DEFAULT_ENTRY else stem,
                     where, _hooks(code))
    return dataclasses.replace(loaded, resizable=frozenset(_accepted(factory, SIZE_PROBE)))


def _hooks(code: Any) -> dict[str, Callable[..., Any]]:
    """The model file's ``calibration()`` (input batches, for --calibrate) and
    ``evaluate(model)`` (the task's metrics), those it defines."""
    return {name: found for name in ("calibration", "evaluate")
            if callable(found := getattr(code, name, None))}


SIZE_PROBE = {"batch": 1, "seq_len": 1, "image_size": 1}    # the sizes a factory may take


def _accepted(factory: Callable[..., Any], sizes: Mapping[str, int]) -> dict[str, int]:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(sizes)
    return {k: v for k, v in sizes.items() if k in parameters}


def _loaded(module: Any, inputs: Any, name: str, source: str,
            hooks: Mapping[str, Callable[..., Any]] | None = None) -> LoadedModel:
    if not isinstance(module, torch.nn.Module):
        raise LoadError(f"{source}: expected an nn.Module, got {type(module).__name__}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, (tuple, dict)):
        raise LoadError(f"{source}: example inputs must be a tuple, a dict or a tensor, "
                        f"got {type(inputs).__name__}")
    check_inputs(module, inputs, source)
    hooks = hooks or {}
    return LoadedModel(module=module, inputs=inputs, name=name, source=source,
                       calibration=hooks.get("calibration"), evaluate=hooks.get("evaluate"))


def _user_error(what: str, error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = user_frame([(f.filename, f.lineno or 0) for f in frames])
    return f"{what}{f' at {where}' if where else ''}: {type(error).__name__}: {error}"


def check_inputs(module: torch.nn.Module, inputs: tuple[Any, ...] | dict[str, Any],
                 source: str) -> None:
    """What eager PyTorch would refuse before any op runs, refused here, before the capture
    (fake and meta kernels accept it and report nonsense): an example input with no elements
    (a 0 in its shape: 0 FLOPs and a training verdict that "fits"), and tensors on two real
    devices (a CUDA input into a CPU model). Mixed dtypes show only per op, so they are
    checked on the captured graph (`fxlens.analyzer.capture.check`)."""
    leaves = pytree.tree_leaves(inputs)
    named = inputs.items() if isinstance(inputs, dict) else enumerate(inputs)
    for name, value in named:
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor) and leaf.numel() == 0:
                label = name if isinstance(name, str) else f"#{name}"
                raise LoadError(f"{source}: example input {label} has shape "
                                f"{tuple(leaf.shape)}, no elements; every size must be at "
                                f"least 1 (check --batch / --seq-len / --image-size)")
    devices = {str(t.device.type) for t in (*module.parameters(), *module.buffers(), *leaves)
               if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    if len(devices) > 1:
        raise LoadError(f"{source}: the model and its example inputs are on different devices "
                        f"({', '.join(sorted(devices))}); eager PyTorch refuses that: move "
                        f"them to one device")


def calibration_batches(loaded: LoadedModel) -> list[Any]:
    """The model file's ``calibration()`` batches (user code, guarded), else the inputs.
    Each batch is what the forward takes, as the example inputs are: a tuple (or list) of
    positional arguments, a dict of keyword arguments, or one tensor."""
    if loaded.calibration is None:
        return [loaded.inputs]
    where = f"{loaded.source}: calibration()"
    try:
        with user_code(where):
            batches = list(loaded.calibration())
    except LoadError:
        raise
    except Exception as error:
        raise LoadError(f"{where} raised {type(error).__name__}: {error}") from error
    if not batches:
        raise LoadError(f"{where} yielded no batches: yield the forward's inputs, one batch "
                        f"at a time")
    return [_as_arguments(batch, where, i) for i, batch in enumerate(batches)]


def _as_arguments(batch: Any, where: str, index: int) -> tuple[Any, ...] | dict[str, Any]:
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, (tuple, list)):
        return tuple(batch)
    if isinstance(batch, dict):
        return batch
    raise LoadError(f"{where}: batch {index} is of type {type(batch).__name__}; yield a tensor, a "
                    f"tuple of the forward's positional inputs or a dict of its keyword inputs")


def task_metrics(loaded: LoadedModel) -> Callable[[torch.nn.Module], dict[str, float]] | None:
    """The model file's ``evaluate(model)`` (user code, guarded, under `torch.no_grad`), its
    answer checked: a dict of metric names to finite numbers (a one-element tensor counts)."""
    evaluate = loaded.evaluate
    if evaluate is None:
        return None
    where = f"{loaded.source}: evaluate(model)"

    def metrics(module: torch.nn.Module) -> dict[str, float]:
        try:
            with user_code(where), torch.no_grad():
                answer = evaluate(module)
        except LoadError:
            raise
        except Exception as error:
            raise LoadError(_user_error(f"{where} raised", error)) from error
        return _checked_metrics(answer, where)
    return metrics


def _checked_metrics(answer: Any, where: str) -> dict[str, float]:
    example = 'return {"accuracy": 0.973} (higher is better) or {"val_loss": 0.41}'
    if not isinstance(answer, Mapping) or not answer:
        raise LoadError(f"{where} returned {type(answer).__name__}; {example}")
    out = {}
    for name, value in answer.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if (not isinstance(name, str) or isinstance(value, bool)
                or not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise LoadError(f"{where}: {name!r}: {value!r} is not a finite number; {example}")
        out[name] = float(value)
    return out
