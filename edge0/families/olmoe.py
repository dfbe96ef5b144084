"""OLMoE: softmax over all experts, top-k, renormalised only with norm_topk_prob (off in 1B-7B).

Experts are `mlp.experts.E.{gate,up,down}_proj.weight`; no shared expert.
"""

from __future__ import annotations

from typing import ClassVar

from edge0.families.base import Family


class Olmoe(Family):
    name = "olmoe"
    model_types: ClassVar[dict[str, str]] = {"olmoe": "olmoe"}
    routing = "softmax, top-k (renormalised with norm_topk_prob)"
