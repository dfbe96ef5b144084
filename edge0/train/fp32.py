"""Full-precision models for training and evaluation: the teacher, and its int4 student."""

from __future__ import annotations

from typing import Any


def load_fp32(path: str, int4: bool = False) -> Any:
    """edge0.load at fp32 (full precision on every backend).

    int4: the int4 student path, as fake quantization (`fake_quantize_student`: the same
    int4 values, fp32 matmuls; the CPU's int4 prefill kernels are ~15x slower).
    """
    import mlx.core as mx

    import edge0.model.loader
    from edge0.train.capture import fake_quantize_student

    loaded = edge0.model.loader.load(path)
    loaded.model.set_dtype(mx.float32)
    if int4:
        fake_quantize_student(loaded.model)
    mx.eval(loaded.model.parameters())
    return loaded


def load_pair(model: str, teacher: str) -> tuple[Any, Any]:
    """(teacher at fp32, int4 student without adapters): an fp MODEL is quantized in memory."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    from edge0.model.lora import remove_lora
    from edge0.train.capture import quantize_student

    t = load_fp32(teacher)
    s = load_fp32(model)
    remove_lora(s.model)
    if not any(isinstance(m, QuantizedSwitchLinear) for _, m in s.model.named_modules()):
        quantize_student(s.model)
    return t, s
