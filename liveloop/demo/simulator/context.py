"""The demo model's context, which every agent task family sizes its prompts and answers against."""

from __future__ import annotations

CONTEXT_BYTES = 1024
"""The tiny byte-level model's context (``learner.tiny_model.TinyModelSpec.max_positions``; one token a byte):
a prompt and its longest answer must fit in it. Kept here, not read from the spec, so that the simulator does
not import the model's libraries; a test holds the two equal."""
