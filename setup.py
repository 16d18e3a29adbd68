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
    install_requires=[
        "jax>=0.7",
        "flax>=0.12",
        "optax",
        "orbax-checkpoint",
        "ml-collections",
        "sentencepiece",
        "absl-py",
        "numpy",
    ],
    extras_require={
        # Benchmarks draw their figures with matplotlib; the exactness certificate
        # (scripts/certify.py) takes its chi-square quantiles from scipy; the tests use both.
        "bench": ["matplotlib", "scipy"],
        # The tests also execute notebooks/speculative_sampling.ipynb (nbclient + a kernel).
        "test": ["pytest>=8", "scipy", "matplotlib", "nbclient", "nbformat", "ipykernel"],
        # Hugging Face parity tests and scripts/compare_hf.py. specsamp's own import and
        # export need none of these (it reads and writes safetensors itself). torch is
        # pinned to a release with a CPU wheel: an open range makes pip fetch the newest
        # build with several GB of CUDA libraries.
        "hf": ["torch==2.13.0", "transformers>=5.0", "safetensors"],
    },
)
