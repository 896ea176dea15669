import os
import shutil

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Copy the package into a build folder cleared first: a module removed or renamed since an earlier build in
    this checkout (its build/lib) was shipped again in the next wheel or install."""

    def run(self):
        stale = os.path.join(self.build_lib, "ucmfh")
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        super().run()


class BuildExt(build_ext):
    """Optimise the Hamming kernels; keep IEEE rounding exact (no FMA contraction)."""

    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                ext.extra_compile_args += ["-O3", "-ffp-contract=off", "-std=c99"]
        super().build_extensions()


# The CPU fast path of ucmfh.metrics (exact Hamming top-K, histograms, MAP@all by counting).
# optional: without a C compiler the install still succeeds and the metrics use torch.
hamming = Extension("ucmfh.metrics._hamming", ["ucmfh/metrics/_hamming.c"], optional=True)

with open("README.md", encoding="utf-8") as readme:
    README = readme.read()

setup(
    name="ucmfh",
    version="0.1.0",
    description="Deep cross-modal hashing on precomputed features: UCMFH, the field's methods, honest evaluation",
    long_description=README,
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ucmfh", "ucmfh.*"]),
    python_requires=">=3.10",  # torch 2.13, the set-up's, has no wheels for 3.9: untested there
    # torch is listed without an upper pin: install the build you want first
    # (README), and pip leaves it in place.
    install_requires=[
        "torch>=2.0",
        # the oldest with wheels for Python 3.11, checked (docs/notebook/dependencies.md); 2.0.0's isin fails on
        # uint64 (the leak check's fingerprints)
        "numpy>=1.23.2,!=2.0.0",
        "scipy>=1.8",
        "h5py>=3.6",
        # cca-itq's PCA: before 1.5 another solver gave other codes (a wiki cell 0.2477 / 0.4072 against 0.3822)
        "scikit-learn>=1.5",
        "click>=8.0",
        "tqdm>=4.60",
    ],
    extras_require={
        # the tests cover the optional pieces too (extraction, plots, training curves, FAISS search)
        # (pytest-xdist: the README's command spreads the tests over the machine's cores)
        # (click 8.2.1: the tests read a command's standard error apart, which CliRunner keeps apart from 8.2)
        "test": ["pytest>=7", "pytest-xdist>=3", "click>=8.2.1", "transformers>=4.30", "pillow>=10.3",
                 "matplotlib>=3.5", "tensorboard>=2.10", "faiss-cpu>=1.7"],
        "plot": ["matplotlib>=3.5", "pillow>=9.1"],
        # `--tensorboard DIR`: each epoch's loss, validation score, learning rate, beta and seconds
        "tensorboard": ["tensorboard>=2.10"],
        # `ucmfh search --backend faiss-ivf|faiss-hnsw` and the benchmarks; the metrics never import it
        "faiss": ["faiss-cpu>=1.7"],
        # CLIP feature extraction (`ucmfh extract`); needs no torchvision
        # (pillow 10.3: before it a 16-bit grey PNG opens as 32-bit mode I, its 8-bit rule then wrong for a dark one)
        "extract": ["transformers>=4.30", "pillow>=10.3"],
    },
    ext_modules=[hamming],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    entry_points={"console_scripts": ["ucmfh=ucmfh.__main__:run"]},
)
