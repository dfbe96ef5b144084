"""Edge0's built-in storage tiers, one module each, registered as `edge0.tiers` entry points."""
