"""Inference engines simlab did not write, driven so their runs can be compared with simlab's
predictions: one folder per engine (llama.cpp: :mod:`simlab.engines.llama_cpp`)."""
