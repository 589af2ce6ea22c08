"""Executors: ``reference`` (NumPy truth), ``sim`` (discrete-event model), ``cuda`` (real GPU)."""
