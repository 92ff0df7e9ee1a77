"""Analysis of estimators and runs: dW bias, variance and MSE diagnostics, the Table 3 summary with paired statistics. May import ``engine.training`` and below."""
