"""The plumbing every layer uses: device resolution, the training step and the batch walk, logging,
thread and scheduler facts, small staged uploads, progress bars and text grids, rank detection, and the
renderer registry that lets a result render itself without importing the layer that draws it."""
