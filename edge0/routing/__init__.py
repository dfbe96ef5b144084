"""Routing: prerouter heads and the predictors built on the families' routers."""
