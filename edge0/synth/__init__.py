"""Random-weight checkpoints: named shapes, tiny HF fixtures, full-size edge0 layouts."""
