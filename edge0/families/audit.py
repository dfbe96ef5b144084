"""The audit's vocabulary: what Edge0 does with one config field (computed, refused, irrelevant).

A `Rule` is one row of the config audit (docs/models.md): `does` says what Edge0 does,
`why` what transformers does with the field and how Edge0 matches it. A rule with
`accepts` refuses every value outside it in one line naming the field and the value;
the value checked is the one transformers uses (absent keys take the model_type's
transformers default), so a config.json that leaves a field out is judged as
transformers would read it. `Rope` checks `rope_parameters` sub-key by sub-key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from edge0.errors import ModelLoadError

COMPUTED, REFUSED, IRRELEVANT, EDGE0 = "computed", "refused unless", "irrelevant", "edge0"


@attrs.frozen
class Rule:
    """What Edge0 does with one config field; `accepts` refuses the values it rejects."""

    does: str
    why: str
    accepts: Callable[[Any, dict[str, Any]], bool] | None = None  # (value, whole config)
    accepted: str = ""  # the accepted values in words, for messages and the audit

    def check(self, key: str, value: Any, model_type: str, config: dict[str, Any]) -> None:
        if self.accepts is None or self.accepts(value, config):
            return
        if self.does == COMPUTED:  # a value no model could have, not an unsupported one
            raise ModelLoadError(
                f"{key}={shown(value)} is invalid: {model_type}'s {key} must "
                f"be {self.accepted} ({self.why})"
            )
        raise refusal(key, value, model_type, self.why, f"{key} {self.accepted}")


def refusal(key: str, value: Any, model_type: str, why: str, accepted: str) -> ModelLoadError:
    """The one-line refusal of a config value (ModelLoadError); `accepted`: what Edge0 runs."""
    return ModelLoadError(
        f"{key}={shown(value)}: {why}, so Edge0 cannot compute this {model_type} model as "
        f"transformers does (it runs {accepted} only)"
    )


def shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def computed(why: str) -> Rule:
    """mlx-lm reads the field and computes what transformers does (golden-tested)."""
    return Rule(COMPUTED, why)


def irrelevant(why: str) -> Rule:
    """The field changes nothing in inference logits (training, outputs, bookkeeping)."""
    return Rule(IRRELEVANT, why)


def edge0(why: str) -> Rule:
    """Edge0 itself reads the field (tokenizer stop ids, dtype, experts, layer rules)."""
    return Rule(EDGE0, why)


def only(*values: Any, why: str) -> Rule:
    """Computed for `values` (what mlx-lm hard-codes); any other value is refused."""
    allowed = list(values)
    words = " or ".join(shown(v) for v in allowed)
    return Rule(REFUSED, why, lambda v, _: v in allowed, words)


def where(test: Callable[[Any, dict[str, Any]], bool], accepted: str, why: str) -> Rule:
    """Computed where `test(value, config)` holds (`accepted` in words); refused elsewhere."""
    return Rule(REFUSED, why, test, accepted)


def checked(test: Callable[[Any, dict[str, Any]], bool], accepted: str, why: str) -> Rule:
    """Computed for every value transformers can run; values outside `accepted` refused."""
    return Rule(COMPUTED, why, test, accepted)


def derived_head_dim(value: Any, cfg: dict[str, Any]) -> bool:
    """head_dim absent or hidden_size // num_attention_heads (what mlx-lm computes)."""
    return value is None or value == cfg["hidden_size"] // cfg["num_attention_heads"]


def positive(value: Any, _: dict[str, Any]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")


def top_k_in_range(value: Any, config: dict[str, Any]) -> bool:
    """1 <= num_experts_per_tok <= the routed expert count."""
    n = next((config[k] for k in EXPERT_COUNTS if isinstance(config.get(k), int)), None)
    return positive(value, config) and (n is None or value <= n)


# sub-keys mlx-lm's rope classes read, per rope_type (beside rope_type and rope_theta)
ROPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "llama3": frozenset(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    ),
    "yarn": frozenset(
        {
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        }
    ),
}
# sub-keys transformers reads that mlx-lm's rope classes do not: harmless at these values
ROPE_NEUTRAL: dict[str, Any] = {
    "truncate": True,
    "attention_factor": None,
    "partial_rotary_factor": 1.0,
}


@attrs.frozen
class Rope:
    """`rope_parameters`: the rope types mlx-lm's class builds for this family, sub-key checks."""

    types: tuple[str, ...]
    why: str
    partial: bool = False  # the family's class reads partial_rotary_factor
    extra: dict[str, Any] = attrs.field(factory=dict)  # sub-key -> the only value computed
    ignored: dict[str, str] = attrs.field(factory=dict)  # sub-key -> why it changes nothing

    def check(self, rope: Any, config: dict[str, Any], model_type: str) -> None:
        rope = rope if isinstance(rope, dict) else {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in self.types:
            raise refusal(
                "rope_parameters.rope_type",
                kind,
                model_type,
                self.why,
                "rope_type " + " or ".join(map(shown, self.types)),
            )
        read = ROPE_KEYS.get(kind, frozenset()) | {"rope_type", "type", "rope_theta"}
        if self.partial:
            read = read | {"partial_rotary_factor"}
        for key, value in rope.items():
            if key in self.extra and value != self.extra[key]:
                why = f"mlx-lm's {model_type} computes {key}={shown(self.extra[key])} only"
                raise refusal(
                    f"rope_parameters.{key}",
                    value,
                    model_type,
                    why,
                    f"{key} {shown(self.extra[key])}",
                )
            if key in read or key in self.extra or key in self.ignored:
                continue
            if key in ROPE_NEUTRAL and value == ROPE_NEUTRAL[key]:
                continue
            if key == "original_max_position_embeddings" and value == config.get(
                "max_position_embeddings"
            ):
                continue  # what mlx-lm's dynamic / default rope assume
            why = f"mlx-lm's {kind} rope for {model_type} does not read {key}"
            accepted = f"{key} {shown(ROPE_NEUTRAL[key])}" if key in ROPE_NEUTRAL else f"no {key}"
            raise refusal(f"rope_parameters.{key}", value, model_type, why, accepted)


Fields = dict[str, Rule | Rope]  # a family's audit rows: config field -> what Edge0 does

# phrases the families' rows share
SHAPE = "mlx-lm builds the layer sizes from it; the weights' shapes are checked against it"
EXPERTS = "routed experts per sparse layer (the expert records)"
TIED_OK = "the lm_head is the embedding (golden-tested tied)"
HALVES = "transformers rotates halves, never pairs (mlx-lm's own key)"
ROPES = ("default", "linear", "dynamic", "yarn", "llama3")  # mlx-lm's initialize_rope, tested
