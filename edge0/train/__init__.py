"""Training for Edge0's quality artifacts: routing traces, prerouter heads, the recovery LoRA."""
