"""Text generation: one decode loop, pluggable samplers, and beam search.

See ``docs/generation.md``.
"""

from lmkit.decoding.beam_search import BeamSearchResult, beam_search, gnmt_length_penalty
from lmkit.decoding.loop import DecodeResult, decode
from lmkit.decoding.samplers import (
    SAMPLER_NAMES,
    BeamSampler,
    GreedySampler,
    RandomSampler,
    Sampler,
    TopKSampler,
    TopPSampler,
    get_sampler,
)

__all__ = [
    "BeamSampler",
    "BeamSearchResult",
    "DecodeResult",
    "GreedySampler",
    "RandomSampler",
    "SAMPLER_NAMES",
    "Sampler",
    "TopKSampler",
    "TopPSampler",
    "beam_search",
    "decode",
    "get_sampler",
    "gnmt_length_penalty",
]
