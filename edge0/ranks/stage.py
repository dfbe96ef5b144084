"""The layer-range view of a model: one rank's layers, loaded alone, and their forward pass
(docs/distributed.md, "One layout directory, not a split copy").
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import make_prompt_cache

from edge0.layout.manifest import Manifest
from edge0.layout.quant import switch_modules
from edge0.layout.safetensors_io import MX_DTYPES


class Absent(nn.Module):
    """A layer another rank owns: no parameters here."""


def text_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(holder of lm_head and args, inner model: embed_tokens/layers/norm) of an mlx-lm model."""
    holder: Any = getattr(model, "language_model", model)
    return holder, holder.model


class Stage:
    """Rank `rank`'s layers `own` of a loaded model: embed (first rank) -> layers -> head (last)."""

    def __init__(self, model: nn.Module, own: range, first: bool, last: bool) -> None:
        self.model = model
        self.own = own
        self.first, self.last = first, last
        holder, inner = text_parts(model)
        self.holder, self.inner = holder, inner
        tied = bool(getattr(holder.args, "tie_word_embeddings", False))
        self.tied = tied
        # mlx-lm's hybrid convention: a layer with is_linear=True keeps an SSM (arrays) cache
        self._linear = [bool(getattr(inner.layers[i], "is_linear", False)) for i in own]
        # the caches one process makes for these layers (a sliding-window layer's keeps its
        # window, a chunked layer's its chunk), taken while every layer is still here: some
        # models' make_cache asks each layer
        whole = make_prompt_cache(model)
        self._caches = [whole[i] for i in own]

    def prune(self) -> None:
        """Drop every module this rank does not run (before the parameters are evaluated)."""
        holder, inner = self.holder, self.inner
        for i in range(len(inner.layers)):
            if i not in self.own:
                inner.layers[i] = Absent()
        if not self.first and not (self.last and self.tied):
            inner.embed_tokens = Absent()
        if not self.last:
            inner.norm = Absent()
            if "lm_head" in holder:
                holder.lm_head = Absent()

    def make_cache(self) -> list[Any]:
        """Fresh, empty caches of the kinds one process gives these layers."""
        return [copy.deepcopy(c) for c in self._caches]

    def forward(self, x: mx.array, cache: list[Any]) -> mx.array:
        """(1, 1) token ids on the first rank, else the (1, 1, d) hidden; -> hidden or logits."""
        h = self.inner.embed_tokens(x) if self.first else x
        for i, lin, c in zip(self.own, self._linear, cache, strict=True):
            mask = create_ssm_mask(h, c) if lin else create_attention_mask(h, c)
            h = self.inner.layers[i](h, mask=mask, cache=c)
        if not self.last:
            return h
        h = self.inner.norm(h)
        return self.inner.embed_tokens.as_linear(h) if self.tied else self.holder.lm_head(h)

    def own_moe(self, manifest: Manifest) -> list[int]:
        return [i for i in manifest.moe_layers if i in self.own]


def load_stage(
    path: Path,
    manifest: Manifest,
    own: range,
    first: bool,
    last: bool,
    experts: str,
    adapter: bool,
    before_prune: Callable[[nn.Module], Any],
) -> tuple[Stage, Any, Any]:
    """Load only `own` layers of an edge0 layout; `before_prune(model)` runs on the whole lazy
    model (predictors read routers of the next rank's first layer). Returns (stage, its result,
    tokenizer). Every check `load_layout` makes is made (edge0.layout.load._open).

    The whole mlx-lm model is built lazily, then every layer this rank does not own becomes
    an empty module before anything is evaluated, so only its own resident tensors are read
    (plus the embedding on the first rank, the final norm and head on the last). A recovery
    LoRA adapter is applied on the whole model first (its loader evaluates the model): with
    one, a rank reads every resident tensor once while loading and keeps only its own."""
    from edge0.layout.load import _open, cast_params, read_expert_stacks
    from edge0.model.loaded import activation_dtype, load_tokenizer
    from edge0.model.lora import maybe_apply_adapters

    _, model = _open(path, "none")  # validated; weights loaded lazily, expert stacks empty
    if experts == "resident":  # this rank's layers' experts only
        switch = switch_modules(model)
        model.load_weights(
            [
                (f"{switch[i][0]}.{n}", a)
                for i in own
                if i in switch
                for n, a in read_expert_stacks(path, manifest, i).items()
            ],
            strict=False,
        )
    # the dtypes one process keeps (edge0.layout.load.load_layout): what the memory plan counts
    cast_params(model, activation_dtype(MX_DTYPES[manifest.float_dtype]), keep=True)
    maybe_apply_adapters(model, path, enabled=adapter)  # evaluates the model when present
    result = before_prune(model)
    stage = Stage(model, own, first, last)
    stage.prune()
    gc.collect()
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for _, value in params:  # one at a time, as load_layout: each source freed once cast
        mx.eval(value)
    mx.clear_cache()  # the freed load buffers are not kept by MLX's allocator
    config = manifest.config
    eos = config.get("eos_token_id") or config.get("text_config", {}).get("eos_token_id")
    return stage, result, load_tokenizer(path, eos)
