"""Where operators and their shapes come from: the registry, shape files, FlagGems checkouts, the inventory catalog."""
