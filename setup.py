"""lmkit: modular text generation for TensorFlow 2, on one process or many (Horovod)."""
from setuptools import find_packages, setup

TF_VERSION = "2.18.1"

setup(
    name="lmkit",
    version="0.1.0",
    description="Modular language models for TensorFlow 2 with distributed training through Horovod",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9,<3.13",
    packages=find_packages(include=["lmkit", "lmkit.*"]),
    install_requires=[
        f"tensorflow-cpu=={TF_VERSION}",
        "horovod==0.28.1",
        "sentencepiece>=0.1.99",
        "numpy>=1.23",
    ],
    extras_require={
        # GPU clusters: pip install -e .[gpu] (pulls CUDA wheels through TensorFlow).
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}"],
        "test": ["pytest>=7", "pytest-timeout>=2.1", "hypothesis>=6"],
        "bench": ["matplotlib>=3.6", "psutil>=5"],
        # Optional PyTorch baseline for benchmarks/train_throughput.py (`make bench-deps`);
        # pinned so that the baseline stays the version the published figures used.
        "bench-torch": ["torch==2.13.0"],
    },
    entry_points={"console_scripts": ["lmkit = lmkit.cli:main"]},
)
