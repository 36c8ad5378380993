"""Live decoding: the same policies on real models, measured, and compared with the simulator."""
