"""The child's pytest plugins, one job each. Each is a class holding the shared RunContext, so
nothing is read from globals or environment variables."""
