"""The model: loading checkpoints into mlx-lm models, resident generation, LoRA and merge."""
