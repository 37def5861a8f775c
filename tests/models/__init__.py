"""The test zoo: small models of our own, each a model file with ``build()``.

`OWN_ZOO` maps a name to its ``build`` function (every model file here is also loadable by path,
as a user's would be). Small `transformers` architectures live in `tests.models.hf_zoo`,
kept apart because importing transformers is slow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.models import branchy, convnet, dict_io, lstm, mlp, tiny_gpt

OWN_ZOO: dict[str, Callable[[], tuple[Any, Any]]] = {
    "mlp": mlp.build,
    "convnet": convnet.build,
    "tiny_gpt": tiny_gpt.build,
    "lstm": lstm.build,
    "branchy": branchy.build,
    "dict_io": dict_io.build,
}
