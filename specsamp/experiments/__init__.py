"""Experiments: the jobs behind scripts/, built on the library (models, sampling, training, hf).

cli.py           what every script does first: argument check, logging, --distributed
config_files.py  loads config files by path (a config that builds on another)
jobs/            what a user runs: the pair (pair.py: a pair config -> tokenizer, target,
                 drafts; trains what is missing), its prompts, the sample job
benchmarks/      what is timed: the one harness (harness.py), timing, the speedup formula and
                 the performance model, the sweep, trees, drafters, the loop's phases, plots
peers/           the same work by other samplers: transformers, keras-hub
proofs/          the evidence: the exactness certificate, AOT compilation for TPU slices,
                 launched-op counts from compiled programs
"""
