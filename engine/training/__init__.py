"""Training one run in this process: from a run config to its model, keys and optimizer
(``build``), the jitted steps (``steps``, ``compiled``), the loop and its records (``loop``),
what happens every n steps (``schedule``, ``phases``), checkpoints (``checkpoints``), step
timing (``timing``), devices, several devices and hosts (``devices``, ``parallel``,
``collectives``), cohorts of seeds trained as one program (``cohort``) and system metrics
(``system``). A change to how a step, an evaluation or a checkpoint is made goes here; who
trains which run, and storing it, is ``engine.runner``. Never storage. May import
``engine.model``, ``engine.data``, ``engine.config`` and below."""
