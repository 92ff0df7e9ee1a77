"""The sketch math in pure JAX: the sketched matmul (a custom VJP) and its estimator family, the fused LM head, attention that recomputes, residual tags. May import ``engine.core``."""
