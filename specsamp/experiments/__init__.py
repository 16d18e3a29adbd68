"""Experiments: the jobs behind scripts/, built on the library (models, sampling, training, hf).

pair.py               a pair config -> tokenizer, target, drafts, prompts (trains what is missing)
sample_job.py         autoregressive vs speculative on the pair (scripts/sample.py)
timing.py             the one timed loop (``time_sampler``), step costs, bandwidth probes
speedup.py            the speedup formula and the measured step costs it takes
benchmark.py          the K x batch x drafter x verifier sweep (scripts/benchmark.py)
benchmark_drafters.py drafters x schedules x K on two tasks (scripts/benchmark_drafters.py)
perf_model.py         analytic roofline of a call on a mesh, calibration, K advice
perf_report.py        the model held against the paper's numbers and this machine's
plots.py              the benchmark figures
compare_hf.py         vs transformers' assisted generation (scripts/compare_hf.py)
certify.py            the exactness certificate (scripts/certify.py)
cli.py                what every script does first: argument check, logging, --distributed
config_files.py       loads config files by path (a config that builds on another)
"""
