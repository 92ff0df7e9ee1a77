"""Analysis of estimators and runs as pure functions of records and frames: dW bias, variance and
MSE diagnoses (``diagnostics``, ``keystats``), the Table 3 summary with paired statistics
(``summary``, ``split_read``), the frames and Plotly figures drawn from them (``frames``,
``method_frames``, ``charts``, ``scatter``, ``parallel``; the dashboard and the reports share
them), the run filter (``where``), tuning's choices and pruning (``tuning``, ``pruning``), the
paper's claims (``claims``) and the report as a document (``report``). A new statistic, figure,
claim or report block goes here, tested on frames without a database. Reads no store
(``engine.reads`` does). May import ``engine.model`` and below; never ``engine.training``,
``storage`` or ``app``."""
