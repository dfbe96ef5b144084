"""What a run will be before anything loads: its options, its footprint, its memory plan."""
