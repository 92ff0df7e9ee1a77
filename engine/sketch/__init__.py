"""The sketch math in pure JAX: the sketched matmul (a custom VJP) and its estimator family, the fused LM head, attention that recomputes, residual tags. May import ``engine.core``.

Which estimator does what is data, ``engine.core.estimators`` (one ``Estimator`` entry each: its
sketch family, bias, flags and kept bytes); ``basis`` and ``head`` read the entry, never a name.
An estimator of the ``compress`` family carries its own array math in its entry, so adding one
is one module of ``engine.core.estimators`` and its tests; a new family is a branch here."""
