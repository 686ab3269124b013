"""The bisect session: the first build at which rows moved (session, search, builds, probe)."""
