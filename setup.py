"""Builds the C++ core (csrc/) as torchneuron/_core*.so, loaded with ctypes at import."""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            "torchneuron._core",
            ["csrc/neuron_core.cpp", "csrc/sparse_coo.cpp", "csrc/nested.cpp"],
            extra_compile_args=["-O2", "-std=c++20", "-fvisibility=hidden", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
