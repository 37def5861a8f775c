"""`analyze validate` on the device for each case: the captured graph run node by node.

The graph is captured and run once (`fxlens.analyzer.time.validate.run_graph`); its roofline is
predicted with every device spec given (the registry's datasheet entry and the calibrated
profile), each set of predictions joined with the one run (`validation_section`). Per spec:
the totals (predicted, measured as the sum of node medians, the interpreted pass and the
module's eager forward), the memory peak and the op classes that take the most measured time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.time.validate import RunSettings, prepare, run_graph, validation_section
from fxlens.devices import predict
from fxlens.rules.hardware import DeviceSpec

from .measure import Case
from .predict import _loaded

TOP_OP_CLASSES = 12


def loaded_case(case: Case) -> LoadedModel:
    """The case's model: a preset, or the test zoo's conv net (``zoo:convnet``)."""
    if case.preset == "zoo:convnet":
        from tests.models import convnet

        width = int(case.overrides.get("width", 16))
        module, inputs = convnet.build(batch=case.batch, image_size=case.seq_len, width=width)
        return LoadedModel(module=module, inputs=inputs, name="convnet",
                           source="tests/models/convnet.py")
    return _loaded(case)


def validate(case: Case, specs: dict[str, DeviceSpec], device: str, warmup: int,
             repeat: int) -> dict[str, Any]:
    loaded = loaded_case(case)
    settings = RunSettings(device, warmup, repeat)
    module, inputs = prepare(loaded.module, loaded.inputs, device)
    real = dataclasses.replace(loaded, module=module, inputs=inputs)
    run = None
    result: dict[str, Any] = {}
    for label, spec in specs.items():
        report, graph = predict(real, spec)
        if run is None:      # one run serves every spec's predictions
            run = run_graph(graph, module, inputs, settings)
        section = validation_section(report, run, settings)
        classes = sorted(section.op_classes, key=lambda c: -c.measured_s)[:TOP_OP_CLASSES]
        result[label] = {
            "total": dataclasses.asdict(section.total),
            "memory": dataclasses.asdict(section.memory),
            "timed_nodes": section.timed_nodes,
            "op_classes": [dataclasses.asdict(c) for c in classes],
        }
    return result
