"""Pipeline parallel streaming over several processes or machines (mlx.core.distributed)."""
