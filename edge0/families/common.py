"""Audit rows every supported family shares: bookkeeping, training-only and geometry fields."""

from __future__ import annotations

from typing import Any

from edge0.families.audit import (
    SHAPE,
    Fields,
    Rule,
    checked,
    edge0,
    irrelevant,
    only,
    positive,
    top_k_in_range,
)
from edge0.model.activations import ACTIVATIONS

OUTPUTS = "an output switch of transformers' forward (what it returns), not its arithmetic"
TRAINING = "used only in training (transformers applies it in train mode or to a loss)"
POSITIVE = "a positive integer"


def size(why: str = SHAPE) -> Rule:
    return checked(positive, POSITIVE, why)


def kv_heads(value: Any, config: dict[str, Any]) -> bool:
    heads = config.get("num_attention_heads")
    return positive(value, config) and (not isinstance(heads, int) or heads % value == 0)


COMMON: Fields = {
    "_name_or_path": irrelevant("where transformers loaded the config from"),
    "architectures": irrelevant("the class names transformers picks; Edge0 goes by model_type"),
    "chunk_size_feed_forward": irrelevant(
        "transformers' feed-forward chunking (memory only, same arithmetic); unused by "
        "these families' decoders"
    ),
    "dtype": edge0(
        "the stored dtype; Edge0 reads each tensor's own dtype and computes in fp32 on "
        "the CPU backend, the checkpoint's dtype on GPUs"
    ),
    "transformers_version": irrelevant("which transformers wrote the file"),
    "id2label": irrelevant("labels of classification heads, not causal LMs"),
    "label2id": irrelevant("labels of classification heads, not causal LMs"),
    "problem_type": irrelevant("loss choice of classification heads"),
    "is_encoder_decoder": only(False, why="every supported family is a decoder-only model"),
    "output_attentions": irrelevant(OUTPUTS),
    "output_hidden_states": irrelevant(OUTPUTS),
    "return_dict": irrelevant(OUTPUTS),
    "use_cache": irrelevant("whether transformers keeps a KV cache; Edge0 always does"),
    "output_router_logits": irrelevant(OUTPUTS + " (router logits for the aux loss)"),
    "router_aux_loss_coef": irrelevant(TRAINING),
    "router_jitter_noise": irrelevant(TRAINING),
    "initializer_range": irrelevant(TRAINING + " (weight init)"),
    "attention_dropout": irrelevant(TRAINING + " (dropout)"),
    "pad_token_id": irrelevant("padding for batched training; Edge0 never pads a sequence"),
    "bos_token_id": edge0("the tokenizer's own settings decide the prompt's first token"),
    "eos_token_id": edge0("generation stops at it (generation_config.json's wins)"),
    "model_type": edge0("picks the family and mlx-lm's module"),
    "vocab_size": size(),
    "hidden_size": size(),
    "intermediate_size": size(SHAPE + " (dense MLPs)"),
    "num_hidden_layers": size(),
    "num_attention_heads": size(),
    "num_key_value_heads": checked(
        kv_heads, "a positive divisor of num_attention_heads", SHAPE + " (grouped-query attention)"
    ),
    "rms_norm_eps": checked(
        lambda v, _: isinstance(v, float) and v > 0, "a positive float", "mlx-lm's RMSNorms take it"
    ),
    "max_position_embeddings": edge0(
        "Edge0's context length (prompts plus generated tokens); dynamic and YaRN ropes read it"
    ),
    "num_experts_per_tok": checked(
        top_k_in_range,
        "from 1 to the routed expert count",
        "the block's top-k, which `--top-k` may lower at run time",
    ),
    "hidden_act": checked(
        lambda v, _: v in ACTIVATIONS,
        "one of transformers' ACT2FN activations ({})".format(", ".join(sorted(ACTIVATIONS))),
        "the gated MLPs' and experts' activation as transformers' ACT2FN computes it "
        "(edge0/model/activations.py; golden-tested gelu, xielu, prelu); prelu's and xielu's "
        "weights are read from the checkpoint (`mlp.act_fn.*`, Llama-4's `activation_fn.*`; "
        "`mlp.experts.act_fn.*`) and kept resident",
    ),
}

# multimodal wrappers (text model under text_config): the top-level fields
WRAPPER: Fields = {
    **{
        k: COMMON[k]
        for k in (
            "_name_or_path",
            "architectures",
            "dtype",
            "transformers_version",
            "output_attentions",
            "output_hidden_states",
            "return_dict",
            "model_type",
            "chunk_size_feed_forward",
            "id2label",
            "label2id",
            "problem_type",
            "is_encoder_decoder",
            "pad_token_id",
            "eos_token_id",
            "bos_token_id",
        )
    },
    "text_config": edge0("the language model, audited field by field below"),
    "vision_config": irrelevant("the vision tower: Edge0 runs the text model only"),
    "tie_word_embeddings": edge0(
        "ties the head to the embedding in a family that reads it here (transformers' rule: "
        "Qwen3.5 does, Llama-4 reads text_config's)"
    ),
    **{
        k: irrelevant("an image/video placeholder token: Edge0 runs text only")
        for k in (
            "boi_token_index",
            "eoi_token_index",
            "image_token_index",
            "image_token_id",
            "video_token_id",
            "vision_start_token_id",
            "vision_end_token_id",
        )
    },
}
