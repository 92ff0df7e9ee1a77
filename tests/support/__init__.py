"""What the tests share, none of it a test: runs written as a worker would (``runs``, ``setups``),
databases (``sqlite``, ``templates``, ``postgres``), the dashboard under AppTest (``pages``) and in
a real browser (``browser``), a one-node Slurm (``slurm``), a disk that fills (``disk_full``),
several devices (``scale_checks``), the compiler settings (``xla``) and the garbage collector
(``collector``) of the suite's processes. A fixture or helper two test files need goes here."""
