"""The pytest child (`python -m harness.child RUN_DIR`): its context, cases and plugins."""
