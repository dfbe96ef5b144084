"""Routing: routing families, prerouter heads and the predictors built on them."""
