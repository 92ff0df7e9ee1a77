"""The network in Flax: layers, the GPT, gradient probes and activation-memory accounting. May import ``engine.sketch`` and ``engine.core``."""
