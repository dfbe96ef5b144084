"""`python -m edge0 ...` = the `edge0` command (what `mlx.launch ... -m edge0 run ...` runs)."""

from edge0.cli.main import main

main()
