"""llama.cpp built from the package index (``build``), its arguments (``args``), traces recorded
with it (``record``), ``llama-speculative-simple`` runs (``run``) and ``llama-server`` (``server``)."""
