"""The streaming MoE block and what it asks per layer: streams, route policies, grouped syncs."""
