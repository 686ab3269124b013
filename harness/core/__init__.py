"""Data types and mechanics every layer uses: the run spec, run dirs, identity, errors, paths, process launch."""
