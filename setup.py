"""Package build. The fused flow-loss CUDA extension (``csrc/``) is built when a CUDA
toolkit and a CUDA build of torch are both present; elsewhere it is skipped and the
pure PyTorch reference is used. Set ``PHF_BUILD_CUDA=0`` to skip it, ``=1`` to insist.

GPU machine:  pip install -e . --no-build-isolation
"""

import glob
import os

from setuptools import setup


def cuda_extensions():
    want = os.environ.get("PHF_BUILD_CUDA", "auto")
    if want == "0":
        return [], {}
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/*.cu"))
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        if want == "1":
            raise
        return [], {}
    if not sources or CUDA_HOME is None or torch.version.cuda is None:
        if want == "1":
            raise RuntimeError("PHF_BUILD_CUDA=1 but no CUDA toolkit / CUDA torch / csrc sources were found")
        return [], {}
    ext = CUDAExtension(
        name="phf_megatron._flow_cuda",
        sources=sources,
        # No --use_fast_math: the 1e-5 agreement with the float64 reference relies on IEEE
        # sqrt/division and on denormals not being flushed (same flags as the JIT build).
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "-lineinfo"]},
    )
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = cuda_extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
