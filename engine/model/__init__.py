"""The network in Flax: layers (``layers``: the dense layers that sketch their backward), the
GPT (``gpt``), gradient probes and activation-memory accounting (``memory``). A change to
the architecture or to what a layer saves for backward goes here; the sketch math itself is
``engine.sketch``. May import ``engine.sketch`` and ``engine.core``."""
