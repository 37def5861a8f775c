"""Well-known `transformers` architectures, built on the meta device from configs we ship.

Each preset is one JSON file in ``hf_presets/``: the config class and model class to build,
the architecture fields copied from the published ``config.json`` of the model named in its
``source`` field (or, for models published without one — GPT-3, NeMo's Nemotron — from the
NeMo training config that path names, in the `transformers` class of the same architecture:
GPT-2's for GPT-3, Nemotron's for Nemotron-4), the published dtype, the input kind and
default input sizes. Nothing is ever downloaded: configs are built from those dicts, modules
are built under ``torch.device("meta")`` (no weights allocated, so a 70B config builds in a
fraction of a second), and example inputs are meta tensors.

Choices made for capture: attention is forced to ``sdpa`` (one op per attention) unless the
preset names another; GPT-OSS's attention sinks, which transformers runs only in its eager
implementation (matmuls and a softmax), are captured as the fused kernels that train and serve
it take them (``"attention": "fxlens_sinks"``, `fxlens.analyzer.capture.hf_sinks`); decoders
run with ``use_cache=False``, MoE experts keep transformers' default implementation, and the
module is in eval mode. A causal language model's training step is given ``labels`` (the
input tokens), so it is recorded with the model's own loss: transformers upcasts the logits to
fp32 for the cross-entropy, 2.7 GiB of GPT-2's 11.5 GiB step at batch 8 × 1024 on an H200.

Input kinds and their example inputs (keyword arguments), with ``B`` batch, ``T`` seq_len:
  text     input_ids (B, T) int64
  seq2seq  input_ids (B, T) and decoder_input_ids (B, T) int64
  image    pixel_values (B, num_channels, S, S) at the parameter dtype, S = image_size
  audio    input_features (B, num_mel_bins, 2 * max_source_positions) at the parameter dtype,
           and decoder_input_ids (B, T) int64 (Whisper's 30 s window is 3000 frames)

Family names users type (``hf:qwen3-moe``, ``hf:gemma-3``, ``hf:phi-3``) are aliases
(`ALIASES`) of one shipped preset each, the family's model of that name: the report and its
source line name the preset built.

Known limitations: ``dtype=None`` means the preset's published dtype (float32 where the
config names none), not torch's default. ``image_size`` rebuilds the model for that resolution
(position embeddings sized for it) instead of interpolating. Overrides are checked against
the config class's declared fields; a value of the wrong type is caught by transformers'
own validation, whose message we pass on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from fxlens.analyzer.capture.hf_sinks import SINK_ATTENTION
from fxlens.analyzer.capture.hf_sinks import register as register_sink_attention
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.loaded import LoadedModel

PRESET_DIR = Path(__file__).with_name("hf_presets")
INSTALL_HINT = "pip install fxlens[hf]"


class InputKind(str, Enum):
    TEXT = "text"
    SEQ2SEQ = "seq2seq"
    IMAGE = "image"
    AUDIO = "audio"


@dataclass(frozen=True)
class Preset:
    """One shipped preset, as read from its JSON file."""

    name: str
    source: str                      # the hub id (or repository path) of the config
    config_class: str                # e.g. "LlamaConfig"
    model_class: str                 # e.g. "LlamaForCausalLM"
    input_kind: InputKind
    dtype: str                       # the published parameter dtype
    config: Mapping[str, Any]
    batch: int = 1
    seq_len: int | None = None
    image_size: int | None = None
    attention: str = "sdpa"          # transformers' attention implementation to capture


# A family name → the shipped preset it builds: Qwen3's MoE and Gemma-3 as text-only
# decoders at the sizes most asked for (the 30B-A3B, whose architecture the 235B shares
# with more layers and experts; the 1B, the text-only Gemma-3), Phi-3 as its mini; GPT-3,
# BLOOM and Nemotron-4 as the one model their names mean (175B, 176B, 340B).
ALIASES: Mapping[str, str] = {
    "qwen3-moe": "qwen3-30b-a3b",
    "gemma-3": "gemma-3-1b",
    "phi-3": "phi-3-mini",
    "llama-3.3-70b": "llama-3.1-70b",     # the same architecture and config, other weights
    "gpt3": "gpt3-175b",
    "gpt-3": "gpt3-175b",
    "bloom": "bloom-176b",
    "nemotron-4": "nemotron-4-340b",
}


def preset_names() -> list[str]:
    """Names of every shipped preset, sorted (aliases are in `ALIASES`)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def read_preset(name: str) -> Preset:
    """The preset `name` or the one it is an alias of; `LoadError` listing the known names
    when there is none."""
    name = ALIASES.get(name, name)
    path = PRESET_DIR / f"{name}.json"
    if name not in preset_names():
        known = ", ".join(preset_names())
        aliases = ", ".join(f"{a} ({p})" for a, p in sorted(ALIASES.items()))
        raise LoadError(f"unknown preset {name!r}; known presets: {known}; aliases: {aliases}")
    raw = json.loads(path.read_text(encoding="utf-8"))
    inputs = raw.get("inputs", {})
    return Preset(
        name=name,
        source=raw["source"],
        config_class=raw["config_class"],
        model_class=raw["model_class"],
        input_kind=InputKind(raw["input_kind"]),
        dtype=raw.get("dtype", "float32"),
        config=raw["config"],
        batch=inputs.get("batch", 1),
        seq_len=inputs.get("seq_len"),
        image_size=inputs.get("image_size"),
        attention=raw.get("attention", "sdpa"),
    )


def parse_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``--set key=value`` values: JSON where they parse (ints, floats, bools, null, lists),
    Python's ``True``/``False``/``None`` too, else the string itself. Non-strings pass as is."""
    return {key: _parse_value(value) for key, value in overrides.items()}


def _parse_value(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    python_literals = {"True": True, "False": False, "None": None}
    if value in python_literals:
        return python_literals[value]
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value  # not JSON: a plain string such as an activation name


def load_preset(
    name: str,
    overrides: Mapping[str, str] | None = None,
    batch: int = 1,
    seq_len: int | None = None,
    image_size: int | None = None,
    dtype: str | None = None,
    allow_large: bool = False,
) -> LoadedModel:
    """Build preset `name` on the meta device with example inputs, ready to capture.

    `overrides` replace config fields (``{"num_hidden_layers": "2"}``); `seq_len` and
    `image_size` default to the preset's; `dtype` (``"bfloat16"``...) to its published dtype.
    A size that does not apply to the preset's input kind (`seq_len` for an image model,
    `image_size` for a text model) is ignored, so one command line fits every preset.
    A config whose layer count makes the capture absurdly long (``num_hidden_layers=100000``)
    is refused with the estimate before anything is built, unless `allow_large`.
    """
    preset = read_preset(name)
    transformers = _import_transformers()
    torch_dtype = _resolve_dtype(dtype or preset.dtype)
    size = image_size if image_size is not None else preset.image_size
    parsed = parse_overrides(overrides or {})
    _check_override_values(preset, parsed)
    config = _build_config(transformers, preset, parsed, size)
    if not allow_large:
        _check_layer_count(preset, config)
    config.dtype = torch_dtype  # as from_pretrained leaves it: the config names the weights' dtype
    model_cls = _class_from(transformers, preset.model_class, preset.name)
    with torch.device("meta"), _default_dtype(torch_dtype):
        try:
            module = model_cls(config)
        except Exception as e:  # a bad override combination surfaces here, in user terms
            raise LoadError(f"preset {name!r}: building {preset.model_class} failed: {e}") from e
    module.eval()
    inputs = _example_inputs(preset, config, batch, seq_len, torch_dtype)
    asked = f"{name} → {preset.name}" if name != preset.name else name
    source = f"preset {asked}: config of {preset.source} (transformers {transformers.__version__})"
    training_inputs = _training_inputs(preset, inputs)
    if training_inputs is not None and getattr(module, "loss_type", None) is None:
        # what transformers falls back to for a class it cannot name (GPT2LMHeadModel), said
        # here so it does not warn on the user's terminal
        module.loss_type = "ForCausalLM"
    resizable = {"batch", "image_size" if preset.input_kind is InputKind.IMAGE else "seq_len"}
    return LoadedModel(module=module, inputs=inputs, name=preset.name, source=source,
                       training_inputs=training_inputs, resizable=frozenset(resizable))


def _training_inputs(preset: Preset, inputs: dict[str, torch.Tensor]
                     ) -> dict[str, torch.Tensor] | None:
    """A causal language model trains on its own loss: ``labels`` = the input tokens (it shifts
    them itself). Other kinds train as recorded from their outputs."""
    causal = preset.model_class.endswith(("ForCausalLM", "LMHeadModel"))
    if preset.input_kind is InputKind.TEXT and causal:
        return {**inputs, "labels": inputs["input_ids"]}
    return None


def _import_transformers() -> Any:
    if importlib.util.find_spec("transformers") is None:
        raise LoadError(f"transformers presets need the transformers package: {INSTALL_HINT}")
    import transformers

    return transformers


def _class_from(transformers: Any, class_name: str, preset: str) -> Any:
    try:
        return getattr(transformers, class_name)
    except AttributeError:
        raise LoadError(
            f"preset {preset!r} needs transformers.{class_name}, which transformers "
            f"{transformers.__version__} lacks; try a newer transformers ({INSTALL_HINT})"
        ) from None


def _resolve_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise LoadError(f"dtype {name!r} is not a floating torch dtype (try bfloat16, float16)")
    return dtype


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build parameters in `dtype` the way ``from_pretrained`` does: buffers that transformers
    computes in float32 on purpose (RoPE frequencies) stay float32, unlike ``module.to()``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _build_config(
    transformers: Any, preset: Preset, overrides: Mapping[str, Any], image_size: int | None
) -> Any:
    config_cls = _class_from(transformers, preset.config_class, preset.name)
    fields = dict(preset.config)
    if image_size is not None and preset.input_kind is InputKind.IMAGE:
        patch = fields.get("patch_size", 1)
        if image_size < patch or image_size % patch:
            raise LoadError(
                f"preset {preset.name!r}: image_size {image_size} must be a positive "
                f"multiple of the patch size {patch}"
            )
        fields["image_size"] = image_size
    try:
        baseline = config_cls(**fields)
        config = config_cls(**{**fields, **overrides}) if overrides else baseline
    except Exception as e:  # transformers raises TypeError, ValueError or StrictDataclassError
        raise LoadError(f"preset {preset.name!r}: invalid config: {e}") from e
    unknown = sorted(
        k for k in overrides if not _is_config_key(config_cls, baseline, config, k, preset.config)
    )
    if unknown:
        declared = _declared_keys(config_cls)
        hints = [m for k in unknown for m in difflib.get_close_matches(k, declared, n=2)]
        hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
        raise LoadError(
            f"preset {preset.name!r}: unknown config key(s) {', '.join(unknown)} for "
            f"{preset.config_class}{hint}. Known keys: {', '.join(declared)}"
        )
    if getattr(config, "use_cache", None) is not None:
        config.use_cache = False
    if preset.attention == SINK_ATTENTION:
        register_sink_attention()
    config._attn_implementation = preset.attention
    return config


# Config keys that count layers; their sum × `NODES_PER_LAYER` estimates the graph's size.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers")
NODES_PER_LAYER = 60     # NB: llama-2-7b: ~1.9 k nodes for 32 layers; gpt2 ~45 per block
_COUNT_SUFFIXES = ("_layers", "_layer", "_heads", "_head", "_size", "_dim", "_positions",
                   "_embd", "_experts", "_per_tok", "_channels", "_mel_bins")


def _check_override_values(preset: Preset, overrides: Mapping[str, Any]) -> None:
    """A negative integer is never a size or a count (ids aside: ``pad_token_id=-1``), and a
    layer, head or width count of 0 builds a model that computes nothing."""
    for key, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        is_id = key.endswith(("_id", "_ids", "_index"))
        is_count = (key.startswith(("num_", "n_")) or key.endswith(_COUNT_SUFFIXES)
                    or key in ("d_model", "d_ff", "d_kv", "vocab_size"))
        if (value < 0 and not is_id) or (value == 0 and is_count and "window" not in key):
            raise LoadError(f"preset {preset.name!r}: --set {key}={value}: a size or count "
                            f"must be at least 1")


def _check_layer_count(preset: Preset, config: Any) -> None:
    """Refuse, with the estimate, a config whose capture would run for hours."""
    from fxlens.analyzer.capture.check import MAX_ESTIMATED_NODES, SECONDS_PER_NODE, too_large

    layers = sum(getattr(config, key, 0) or 0 for key in LAYER_KEYS
                 if isinstance(getattr(config, key, 0), int))
    nodes = layers * NODES_PER_LAYER
    if nodes > MAX_ESTIMATED_NODES:
        raise LoadError(too_large(f"preset {preset.name!r} with {layers:,} layers", nodes,
                                  nodes * SECONDS_PER_NODE))


def _declared_keys(config_cls: type) -> list[str]:
    fields = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(
        config_cls
    ) else set()
    return sorted(fields | set(getattr(config_cls, "attribute_map", {})))


def _is_config_key(
    config_cls: type, baseline: Any, config: Any, key: str, preset_fields: Mapping[str, Any]
) -> bool:
    """A key is known when the class declares it (field, alias or property), the preset uses
    it, the config consumed it (``rope_theta`` → ``rope_parameters``) or it is set anyway.

    NB: transformers stores unknown keyword arguments as plain attributes without complaint,
    so "left behind as a new attribute" is what marks a key as unknown.
    """
    if key in _declared_keys(config_cls) or key in preset_fields:
        return True
    if isinstance(getattr(config_cls, key, None), property):
        return True
    return key not in vars(config) or key in vars(baseline)


def _example_inputs(
    preset: Preset, config: Any, batch: int, seq_len: int | None, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    if batch < 1:
        raise LoadError(f"batch must be at least 1, got {batch}")
    kind = preset.input_kind
    if kind is InputKind.IMAGE:
        size = config.image_size
        return {"pixel_values": _meta((batch, config.num_channels, size, size), dtype)}
    length = seq_len if seq_len is not None else (preset.seq_len or 128)
    _check_length(preset, config, length)
    tokens = _meta((batch, length), torch.int64)
    if kind is InputKind.TEXT:
        return {"input_ids": tokens}
    if kind is InputKind.SEQ2SEQ:
        return {"input_ids": tokens, "decoder_input_ids": _meta((batch, length), torch.int64)}
    frames = 2 * config.max_source_positions  # the encoder's two convs halve the frame count
    features = _meta((batch, config.num_mel_bins, frames), dtype)
    return {"input_features": features, "decoder_input_ids": tokens}


def context_limit(name: str, overrides: Mapping[str, str] | None = None
                  ) -> tuple[int, str] | None:
    """The longest ``seq_len`` preset `name` with `overrides` accepts, and the config key that
    sets it as the preset spells it (``n_positions`` for GPT-2); None for image models and
    configs without a limit. Builds the config only (imports transformers, builds no model)."""
    preset = read_preset(name)
    if preset.input_kind is InputKind.IMAGE:
        return None
    parsed = parse_overrides(overrides or {})
    _check_override_values(preset, parsed)
    config = _build_config(_import_transformers(), preset, parsed, None)
    limit, key = _length_limit(preset, config)
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    return limit, getattr(config, "attribute_map", {}).get(key, key)


def _length_limit(preset: Preset, config: Any) -> tuple[Any, str]:
    """The config's limit on ``seq_len`` (not always an int) and the key it is read by."""
    key = "max_target_positions" if preset.input_kind is InputKind.AUDIO else (
        "max_position_embeddings"
    )
    return getattr(config, key, None), key


def _check_length(preset: Preset, config: Any, length: int) -> None:
    """Learned position tables index out of range silently on meta, so check up front."""
    limit, limit_key = _length_limit(preset, config)
    if length < 1 or (isinstance(limit, int) and length > limit):
        raise LoadError(
            f"preset {preset.name!r}: seq_len {length} outside 1..{limit} ({limit_key}); "
            f"lower seq_len or raise it with --set {limit_key}=N"
        )


def _meta(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")
