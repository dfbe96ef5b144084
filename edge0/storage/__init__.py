"""Storage: the Tier contract and tier spec strings; the built-in tiers live in `tiers/`."""
