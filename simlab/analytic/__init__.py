"""Closed forms of speculative decoding (``closed_form``) and the same beside a trace's
simulation (``on_trace``): where the papers' i.i.d. assumption holds and where it breaks."""
