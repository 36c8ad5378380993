"""Inference engines simlab did not write, built from the package index so their runs can be
compared with simlab's predictions (llama.cpp: :mod:`simlab.engines.llama_cpp`)."""
