"""MoEConfig: the C++ MoEConfig's fields, and its one-line text form.

Every config goes through the C++ parser: the text a config prints is
MoEConfig::to_string of MoEConfig::parse of the fields, so Python and C++
never disagree on a value or a default.
"""

import dataclasses
from dataclasses import dataclass

from . import _lib


@dataclass
class RoutingConfig:
    policy: str = "Renormalize"
    num_experts: int = 0
    top_k: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    has_bias: bool = False
    logits_type: str = "F32"


@dataclass
class ExpertsConfig:
    hidden: int = 0
    intermediate: int = 0
    activation: str = "SwiGLU"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    has_bias: bool = False
    local_expert_offset: int = 0
    num_local_experts: int = -1
    quant: str = "BF16"


@dataclass
class BackendOptions:
    backend: str = "auto"
    deterministic: bool = True
    routing_variant: str = "auto"


# (text key, part, field): the text form's keys, in MoEConfig::to_string's order.
_KEYS = [
    ("policy", "routing", "policy"),
    ("E", "routing", "num_experts"),
    ("K", "routing", "top_k"),
    ("n_group", "routing", "n_group"),
    ("topk_group", "routing", "topk_group"),
    ("scale", "routing", "routed_scaling_factor"),
    ("routing_bias", "routing", "has_bias"),
    ("logits", "routing", "logits_type"),
    ("H", "experts", "hidden"),
    ("I", "experts", "intermediate"),
    ("act", "experts", "activation"),
    ("alpha", "experts", "swiglu_alpha"),
    ("limit", "experts", "swiglu_limit"),
    ("expert_bias", "experts", "has_bias"),
    ("local_offset", "experts", "local_expert_offset"),
    ("local_experts", "experts", "num_local_experts"),
    ("quant", "experts", "quant"),
    ("backend", "options", "backend"),
    ("deterministic", "options", "deterministic"),
    ("routing_variant", "options", "routing_variant"),
]
_PART_TYPES = {"routing": RoutingConfig, "experts": ExpertsConfig, "options": BackendOptions}

# Flat keyword names of MoEConfig(...): each field's own name, except the two
# has_bias fields, which take their text keys.
_FLAT = {key if key in ("routing_bias", "expert_bias") else name: (part, name)
         for key, part, name in _KEYS}


def _value_text(part, name, value):
    """One field's value as the text form writes it; TypeError for a value
    of the wrong Python type, Error for a string the form cannot hold."""
    where = f"{part}.{name}"
    kind = type(getattr(_PART_TYPES[part](), name))
    if kind is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {value!r} is not a bool")
        return "1" if value else "0"
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}: {value!r} is not an int")
        return str(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where}: {value!r} is not a number")
        return repr(float(value))
    if not isinstance(value, str):
        raise TypeError(f"{where}: {value!r} is not a str")
    if not value or any(c.isspace() for c in value) or "=" in value:
        raise _lib.Error(f"{where}: {value!r} is not a single word", where)
    return value


def _from_text(part, name, text):
    kind = type(getattr(_PART_TYPES[part](), name))
    if kind is bool:
        return text in ("1", "true")
    return kind(text)


class MoEConfig:
    """The layer's config, as the C++ unimoe::MoEConfig.

    Build it from its parts, from flat keyword arguments, or from its text:

        MoEConfig(policy="Renormalize", num_experts=128, top_k=8, hidden=2048,
                  intermediate=768)
        MoEConfig(routing=RoutingConfig(...), experts=ExpertsConfig(...))
        MoEConfig.parse("policy=Renormalize E=128 K=8 H=2048 I=768")

    Flat keywords are the fields' names, except `routing_bias` and
    `expert_bias` for the two `has_bias` fields. Enum fields are the C++
    names as strings ("Renormalize", "SwiGLU", "BF16", "F32"). A value the
    C++ parser refuses raises unimoe.Error (a ValueError) naming the field;
    validate() also checks that the values fit together, as creating a
    layer does.
    """

    def __init__(self, routing=None, experts=None, options=None, **fields):
        self.routing = dataclasses.replace(routing) if routing else RoutingConfig()
        self.experts = dataclasses.replace(experts) if experts else ExpertsConfig()
        self.options = dataclasses.replace(options) if options else BackendOptions()
        for key, value in fields.items():
            if key not in _FLAT:
                raise TypeError(f"MoEConfig: unknown field {key!r}; allowed: {', '.join(_FLAT)}")
            part, name = _FLAT[key]
            setattr(getattr(self, part), name, value)
        self._normalize()

    def _raw_text(self):
        return " ".join(f"{key}={_value_text(part, name, getattr(getattr(self, part), name))}"
                        for key, part, name in _KEYS)

    def _normalize(self):
        """Takes the fields back from the C++ parser's text of them."""
        text = _lib.call_str(_lib.lib.unimoe_config_normalize, self._raw_text().encode(), 0)
        self._set_from_text(text)

    def _set_from_text(self, text):
        by_key = {key: (part, name) for key, part, name in _KEYS}
        for item in text.split():
            key, value = item.split("=", 1)
            part, name = by_key[key]
            setattr(getattr(self, part), name, _from_text(part, name, value))

    @classmethod
    def parse(cls, text):
        """The config of a text form line (MoEConfig::parse)."""
        if not isinstance(text, str):
            raise TypeError(f"MoEConfig.parse: {text!r} is not a str")
        normalized = _lib.call_str(_lib.lib.unimoe_config_normalize, text.encode(), 0)
        config = cls()
        config._set_from_text(normalized)
        return config

    def to_string(self):
        """The one-line text form (MoEConfig::to_string): the log line and
        the tuning-cache key."""
        return _lib.call_str(_lib.lib.unimoe_config_normalize, self._raw_text().encode(), 0)

    __str__ = to_string

    def __repr__(self):
        return f"MoEConfig.parse({self.to_string()!r})"

    def __eq__(self, other):
        return isinstance(other, MoEConfig) and self.to_string() == other.to_string()

    def __hash__(self):
        return hash(self.to_string())

    def validate(self):
        """Raises unimoe.Error naming the first impossible setting (unimoe::validate)."""
        _lib.call_str(_lib.lib.unimoe_config_normalize, self._raw_text().encode(), 1)

    def local_experts(self):
        """E_local: num_local_experts, or E when it is -1."""
        n = self.experts.num_local_experts
        return self.routing.num_experts if n < 0 else n

    def gemm1_cols(self):
        """Rows of w13 per expert: 2I for gated activations, I for ReLU2."""
        i = self.experts.intermediate
        return i if self.experts.activation == "ReLU2" else 2 * i


def as_config(config):
    """A MoEConfig from a MoEConfig or its text form."""
    if isinstance(config, MoEConfig):
        return MoEConfig.parse(config.to_string())
    if isinstance(config, str):
        return MoEConfig.parse(config)
    raise TypeError(f"config: {type(config).__name__} is neither a MoEConfig nor its text form")


__all__ = ["MoEConfig", "RoutingConfig", "ExpertsConfig", "BackendOptions", "as_config"]
