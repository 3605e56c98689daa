"""Device-side and launch code shared by every kernel family."""
