"""The commands: resolve a run spec, run it, sweep, A/B, batch, inventory regeneration."""
