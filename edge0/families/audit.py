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


# sub-keys transformers reads, per rope_type (beside rope_type and rope_theta): Edge0 computes
# every one (edge0.model.rope, checked against transformers' ROPE_INIT_FUNCTIONS)
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale")
ROPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "yarn": frozenset({*YARN_KEYS, "mscale_all_dim", "attention_factor", "truncate"}),
    "llama3": frozenset(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    ),
    "longrope": frozenset(
        {
            "factor",
            "original_max_position_embeddings",
            "short_factor",
            "long_factor",
            "attention_factor",
        }
    ),
    "proportional": frozenset({"factor", "partial_rotary_factor"}),
}
ROPE_TYPES = tuple(ROPE_KEYS)


@attrs.frozen
class Rope:
    """`rope_parameters`: every rope type transformers computes is computed (edge0.model.rope);
    a rotated share (`partial_rotary_factor`) where the family's attention rotates a share."""

    why: str
    partial: bool = False  # the family's attention rotates a share of each head
    ignored: dict[str, str] = attrs.field(factory=dict)  # sub-key -> why it changes nothing
    types: tuple[str, ...] = ROPE_TYPES

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
        share = rope.get("partial_rotary_factor", 1.0)
        if not self.partial and share != 1.0 and kind not in ("default", "proportional"):
            why = (
                f"transformers' {model_type} rotates whole heads: its {kind} rope over a share of "
                "each head fails in its attention"
            )
            raise refusal("rope_parameters.partial_rotary_factor", share, model_type, why, "1.0")
        if kind == "longrope":
            head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
            pairs = int(int(head) * (float(share) if self.partial else 1.0)) // 2
            for key in ("short_factor", "long_factor"):
                if len(rope.get(key) or []) != pairs:
                    why = (
                        f"transformers' longrope takes one {key} per rotated pair ({pairs} here) "
                        "and fails in its attention otherwise"
                    )
                    raise refusal(
                        f"rope_parameters.{key}", rope.get(key), model_type, why, f"{pairs} values"
                    )


Fields = dict[str, Rule | Rope]  # a family's audit rows: config field -> what Edge0 does

# phrases the families' rows share
SHAPE = "mlx-lm builds the layer sizes from it; the weights' shapes are checked against it"
EXPERTS = "routed experts per sparse layer (the expert records)"
TIED_OK = "the lm_head is the embedding (golden-tested tied)"
HALVES = "not transformers' (it rotates halves, never pairs); Edge0 tells mlx-lm false"
ROPE_WHY = "each rope_type as transformers' ROPE_INIT_FUNCTIONS computes it (edge0/model/rope.py)"
ROPE = Rope(ROPE_WHY)
ROPE_PARTIAL = Rope(ROPE_WHY, partial=True)  # the family's attention rotates a share of each head
