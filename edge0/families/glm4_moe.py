"""GLM-4.5 / 4.6 (glm4_moe): DeepSeek-V3 routing (sigmoid, bias, groups), standard attention.

The first `first_k_dense_replace` layers are dense; shared experts are added
ungated; experts are `mlp.experts.E.{gate,up,down}_proj.weight`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from edge0.families.deepseek_v3 import DeepseekV3


class Glm4Moe(DeepseekV3):
    name = "glm4_moe"
    model_types: ClassVar[dict[str, str]] = {"glm4_moe": "glm4_moe"}

    def normalize(self, tc: dict[str, Any]) -> dict[str, Any]:
        # fields mlx-lm's ModelArgs requires that transformers 5 may leave out
        tc.setdefault("rope_scaling", None)
        tc.setdefault("use_qk_norm", False)
        tc.setdefault("attention_bias", False)
        tc.setdefault("partial_rotary_factor", 0.5)
        return super().normalize(tc)

    def sparse_layers(self, tc: dict[str, Any]) -> list[int]:
        first = int(tc.get("first_k_dense_replace") or 0)
        return list(range(first, int(tc["num_hidden_layers"])))
