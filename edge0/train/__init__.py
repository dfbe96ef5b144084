"""Training for Edge0's quality artifacts: prerouter traces and heads (later: recovery LoRA)."""
