"""Random-weight checkpoints: named shapes, tiny HF fixtures, edge0 layouts, expert stores."""
