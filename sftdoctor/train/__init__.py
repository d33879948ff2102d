"""The bundled trainer. Submodules import the training stack lazily; this package imports nothing."""
