"""Run tooling around the loop: metric names and rows (metrics.py), the console and metrics.jsonl
(monitor.py), Weights & Biases (wandb_sink.py), the profiler (profiling.py), and the comparison of runs
(sweep.py after a multirun, compare.py for `rlft compare`)."""
