"""grpo_jax: critic-free RL (GRPO family) for language models on verifiable tasks, as one compiled JAX graph."""
import setuptools

# Versions tested together on Python 3.11 (CPU), 2026-11-29.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "tensorflow-datasets==4.9.10",
    "array-record==0.8.6",
    # tensorflow-datasets imports it to prepare a dataset (DatasetBuilder.code_path) but does not declare it: without
    # it, preparing gsm8k in a fresh venv fails with ModuleNotFoundError.
    "importlib_resources==7.1.0",
    # GSM8K as the Hugging Face hub serves it (parquet, tasks/gsm8k.py). tensorflow-datasets pulls it in today; it is
    # imported directly, so it is pinned here.
    "pyarrow==26.0.1",
    "sentencepiece==0.2.3",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "numpy==2.4.6",
    # TensorBoard event files without TensorFlow (tensorboardX), the run's PNG plots (matplotlib).
    "tensorboardX==2.6.5",
    "matplotlib==3.11.2",
    "safetensors==0.8.0",
    "ml-dtypes==0.6.0",  # bfloat16 numpy arrays: grpo_jax/hf/safetensors_io.py reads and writes HF checkpoints with it
]

HF = ["torch==2.13.0", "transformers==5.24.0", "tokenizers==0.23.3"]  # HF checkpoints and tokenizer.json
TPU = ["libtpu==0.0.42.1"]  # the TPU compiler on a CPU machine (grpo_jax.perf.aot); the version jax[tpu]==0.10.2 pins
# NVIDIA GPUs (CUDA 12, Linux x86-64): what jax[cuda12]==0.10.2 pins, named (PyPI, 2026-12-05): the CUDA plugin and
# its PJRT runtime at jax's version; the plugin's `with-cuda` extra brings the CUDA libraries (cuBLAS, cuDNN 9.8+,
# NCCL, ... as nvidia-*-cu12 wheels at the plugin's lower bounds). benchmarks/device_check.sh is the first run.
GPU = ["jax[cuda12]==0.10.2", "jax-cuda12-plugin[with-cuda]==0.10.2", "jax-cuda12-pjrt==0.10.2"]

MATH = ["math-verify==0.9.0"]

EXTRAS = {
    "hf": HF,
    "tpu": TPU,
    "gpu": GPU,
    "math": MATH,  # task.grader=symbolic (tasks/symbolic.py: sympy-based answer equivalence)
    # The tests compare our logits with transformers' (and a PEFT-loaded LoRA adapter's), compile one step for a
    # TPU topology and grade symbolically.
    "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "peft==0.21.2"] + MATH + HF + TPU,
}

setuptools.setup(
    name="grpo_jax",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["grpo_jax", "grpo_jax.*"]),
    package_data={"grpo_jax.tasks": ["assets/*.model"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
