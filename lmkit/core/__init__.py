"""lmkit's base: errors, argument checks, registries, files written whole, the run folder's layout,
signals and progress lines. Imports no TensorFlow and nothing else of lmkit."""
