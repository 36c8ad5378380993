"""vLLM as an engine: installed into an environment of its own (``install``), driven through a
runner that runs in vLLM's Python and speaks JSON with simlab (``simlab_vllm_runner``, ``jobs``),
traces recorded with it (``record``) and its latencies read from its own steps (``steps``)."""
