"""Model configuration: one frozen dataclass, validated in one place, plus named presets."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from mtplab.model.forms import FORMS, GraphForm, resolve

DTYPES = ("fp32", "fp16")
WEIGHT_FORMATS = ("fp32", "int4")
CONV_KERNEL = 4
INT4_BLOCK = 32
MAX_TRANSITION_CAPACITY = 8
MIN_SEQ_LEN = 32  # the build decodes its behaviour figures (a prompt of 8 and 16 warm-up positions) and the head's text
# Bumped whenever the ONNX graphs' form changes, so that cached builds of the old form are not reused.
GRAPH_VERSION = 4


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the built-in hybrid model: Gated DeltaNet layers, GQA layers every few, and an MTP head."""

    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 4
    attention_layers: tuple[int, ...] | None = None  # None: every 4th layer (3, 7, ...)
    gdn_key_heads: int = 2
    gdn_value_heads: int = 4
    gdn_head_dim_k: int = 16
    gdn_head_dim_v: int = 16
    attn_heads: int = 4
    attn_kv_heads: int = 2
    attn_head_dim: int = 16
    mlp_size: int = 128
    max_seq_len: int = 256
    transition_capacity: int = MAX_TRANSITION_CAPACITY
    dtype: str = "fp32"
    weight_format: str = "fp32"
    seed: int = 0
    name: str = "custom"
    # Scales that shape the untrained weights (see README: "the built-in model").
    layer_scale: float = 0.45
    logit_scale: float = 6.0
    bigram_peak: float = 20.0
    state_gain: float = 16.0  # how much the GatedDeltaNet layers write into the residual stream
    key_alignment: float = 2.5  # shared query/key direction: the state's readout depends on the history
    decay_shift: float = -5.0  # added to a_log: longer recurrent memory
    beta_bias: float = -3.5  # GatedDeltaNet write strength (sigmoid): lower keeps a longer memory
    conv_memory: float = 0.5  # size of the causal conv's taps on the previous tokens (the current one's is ~1)
    head_fit_tokens: int = 2048  # generated tokens the MTP head's input projection is fitted on
    conv_kernel: int = field(default=CONV_KERNEL)
    graph_form: str | None = None  # mtplab.model.forms; None: the installed onnxruntime's (set at build)

    def __post_init__(self) -> None:
        validate(self)

    @property
    def attention_layer_ids(self) -> tuple[int, ...]:
        if self.attention_layers is None:
            return tuple(i for i in range(self.num_layers) if i % 4 == 3)
        return tuple(sorted(self.attention_layers))

    @property
    def gdn_layer_ids(self) -> tuple[int, ...]:
        attn = set(self.attention_layer_ids)
        return tuple(i for i in range(self.num_layers) if i not in attn)

    @property
    def gdn_conv_channels(self) -> int:
        return 2 * self.gdn_key_heads * self.gdn_head_dim_k + self.gdn_value_heads * self.gdn_head_dim_v

    @property
    def form(self) -> GraphForm:
        return resolve(self.graph_form)

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["attention_layers"] = list(self.attention_layer_ids)
        return d

    def config_hash(self) -> str:
        d = self.to_dict()
        d.pop("name")
        d["graph_version"] = GRAPH_VERSION
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def check_k(self, k: int) -> None:
        """Raise ValueError unless k drafts (a verify of k+1 tokens) fit the transition capacity."""
        if problem := k_problem(k, self.transition_capacity):
            raise ValueError(problem)


def k_problem(k, capacity: int = MAX_TRANSITION_CAPACITY) -> str | None:
    """Why k drafts (a verify of k+1 tokens) do not fit a GatedDeltaNet transition capacity, or None.

    The one check of k's bounds: RunConfig's validation and ModelConfig.check_k both call it.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return f"k={k!r}: must be an integer >= 1"
    if k + 1 > capacity:
        return (
            f"k={k}: k+1={k + 1} exceeds the GatedDeltaNet transition capacity {capacity} "
            f"(allowed: k in 1..{capacity - 1})"
        )
    return None


def _positive(cfg: ModelConfig, name: str) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive integer")


def validate(cfg: ModelConfig) -> None:
    """All ModelConfig checks live here; each error names the field and what is allowed."""
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "gdn_key_heads",
        "gdn_value_heads",
        "gdn_head_dim_k",
        "gdn_head_dim_v",
        "attn_heads",
        "attn_kv_heads",
        "attn_head_dim",
        "mlp_size",
        "max_seq_len",
        "transition_capacity",
        "head_fit_tokens",
    ):
        _positive(cfg, name)
    if cfg.dtype not in DTYPES:
        raise ValueError(f"ModelConfig.dtype={cfg.dtype!r}: allowed values are {list(DTYPES)}")
    if cfg.weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"ModelConfig.weight_format={cfg.weight_format!r}: allowed values are {list(WEIGHT_FORMATS)}")
    if cfg.graph_form is not None and cfg.graph_form not in FORMS:
        raise ValueError(f"ModelConfig.graph_form={cfg.graph_form!r}: allowed values are {sorted(FORMS)} or None")
    if cfg.conv_kernel != CONV_KERNEL:
        raise ValueError(f"ModelConfig.conv_kernel={cfg.conv_kernel}: only {CONV_KERNEL} is allowed")
    if cfg.transition_capacity > MAX_TRANSITION_CAPACITY:
        raise ValueError(
            f"ModelConfig.transition_capacity={cfg.transition_capacity}: allowed values are "
            f"1..{MAX_TRANSITION_CAPACITY} (GatedDeltaNet state_update_capacity)"
        )
    if cfg.attn_heads * cfg.attn_head_dim != cfg.hidden_size:
        raise ValueError(
            f"ModelConfig.hidden_size={cfg.hidden_size} is not divisible into attn_heads={cfg.attn_heads} "
            f"of attn_head_dim={cfg.attn_head_dim}: hidden_size must equal attn_heads * attn_head_dim"
        )
    if cfg.attn_heads % cfg.attn_kv_heads:
        raise ValueError(f"ModelConfig.attn_kv_heads={cfg.attn_kv_heads}: must divide attn_heads={cfg.attn_heads}")
    if cfg.attn_head_dim % 16:  # onnxruntime's GroupQueryAttention refuses rotary caches on other head sizes
        raise ValueError(f"ModelConfig.attn_head_dim={cfg.attn_head_dim}: must be a multiple of 16 "
                         "(GroupQueryAttention's rotary caches)")
    if cfg.vocab_size < 2:
        raise ValueError(f"ModelConfig.vocab_size={cfg.vocab_size}: must be >= 2 (a draft that can be wrong, a top-2 "
                         "margin)")
    if cfg.transition_capacity < 2:
        raise ValueError(f"ModelConfig.transition_capacity={cfg.transition_capacity}: allowed values are "
                         f"2..{MAX_TRANSITION_CAPACITY} (a verify holds k + 1 >= 2 tokens' transitions)")
    if cfg.max_seq_len < MIN_SEQ_LEN:
        raise ValueError(f"ModelConfig.max_seq_len={cfg.max_seq_len}: must be >= {MIN_SEQ_LEN} (the build's behaviour "
                         "figures and the head's training text decode that far)")
    if cfg.gdn_value_heads % cfg.gdn_key_heads:
        raise ValueError(
            f"ModelConfig.gdn_value_heads={cfg.gdn_value_heads}: must be a multiple of "
            f"gdn_key_heads={cfg.gdn_key_heads}"
        )
    if cfg.attention_layers is not None:
        bad = [i for i in cfg.attention_layers if not isinstance(i, int) or not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(
                f"ModelConfig.attention_layers has {bad} out of range: allowed indices are 0..{cfg.num_layers - 1}"
            )
        if len(set(cfg.attention_layers)) != len(cfg.attention_layers):
            raise ValueError(f"ModelConfig.attention_layers={cfg.attention_layers}: duplicate index")
    if not cfg.attention_layer_ids:
        raise ValueError("ModelConfig.attention_layers: the layout needs at least one attention layer")
    if not cfg.gdn_layer_ids:
        raise ValueError("ModelConfig.attention_layers: the layout needs at least one GatedDeltaNet layer")
    if cfg.weight_format == "int4":
        for name in ("hidden_size", "mlp_size"):
            if getattr(cfg, name) % INT4_BLOCK:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(cfg, name)}: int4 weights need a multiple of {INT4_BLOCK}"
                )
        if (cfg.gdn_value_heads * cfg.gdn_head_dim_v) % INT4_BLOCK:
            raise ValueError("ModelConfig.gdn_value_heads*gdn_head_dim_v: int4 weights need a multiple of 32")


PRESETS: dict[str, ModelConfig] = {
    # Tests: builds and runs in well under a second. Attention at layers 1 and 3: a KV bug in layer 1 reaches
    # the recurrent state of layer 2 (the lossless check's state comparison sees it even where KV is unchecked).
    "tiny": ModelConfig(name="tiny", attention_layers=(1, 3), state_gain=24.0),
    # CPU default: 24 layers (6 attention), weight-dominated decode; one MTP layer is ~4% of a forward.
    "small": ModelConfig(
        name="small",
        vocab_size=2048,
        hidden_size=512,
        num_layers=24,
        gdn_key_heads=4,
        gdn_value_heads=8,
        gdn_head_dim_k=64,
        gdn_head_dim_v=64,
        attn_heads=8,
        attn_kv_heads=2,
        attn_head_dim=64,
        mlp_size=1536,
        max_seq_len=512,
    ),
    # GPU-sized; still builds on CPU (about 1.2 GB at fp32).
    "base": ModelConfig(
        name="base",
        vocab_size=32768,
        hidden_size=1024,
        num_layers=24,
        gdn_key_heads=8,
        gdn_value_heads=16,
        gdn_head_dim_k=64,
        gdn_head_dim_v=64,
        attn_heads=16,
        attn_kv_heads=4,
        attn_head_dim=64,
        mlp_size=2816,
        max_seq_len=2048,
    ),
}


def preset(name: str, **overrides) -> ModelConfig:
    """Return a named preset, optionally with fields replaced (e.g. dtype='fp16')."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: allowed presets are {sorted(PRESETS)}")
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg


def preset_name(name: str, int4: bool = False) -> str:
    """A preset's name as a model: "tiny", or "tiny-int4" with int4 weights (another model, timed and calibrated
    apart)."""
    return f"{name}-int4" if int4 else name


def preset_config(name: str, int4: bool = False, dtype: str = "fp32") -> ModelConfig:
    """A preset as the model a run builds: int4 or fp32 weights, activations in `dtype`, named as that model
    ("tiny-int4": the same name in results, calibrations and the model cache)."""
    return preset(name, weight_format="int4" if int4 else "fp32", dtype=dtype).replace(name=preset_name(name, int4))


def capacity_problem(prompt_len: int, tokens: int, k: int, capacity: int, what: str) -> str | None:
    """Why a run's prompt, tokens and verify headroom 2*(k+1) do not fit a KV capacity (`what` names it), or None."""
    headroom = 2 * (k + 1)
    if prompt_len + headroom >= capacity:
        return (
            f"a prompt of {prompt_len} tokens (prompt_len, or a prompt set's row cut to context): the prompt and "
            f"2*(k+1) = {headroom} tokens of verify headroom leave no room "
            f"for tokens in {what} {capacity}"
        )
    need = prompt_len + tokens + headroom
    if need > capacity:
        return (
            f"tokens={tokens}: prompt ({prompt_len}) + tokens + 2*(k+1) = {need} exceeds {what} {capacity} "
            f"(allowed: tokens <= {capacity - prompt_len - headroom})"
        )
    return None
