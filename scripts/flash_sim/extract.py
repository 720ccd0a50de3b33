"""Writes flash_sim_kernels.h: the device code of kernels/cuda/flash_attention.cu with its PTX
wrappers replaced by the CPU emulations in wrappers.h and its host side cut off, for main.cpp."""
import os
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "../../kernels/cuda/flash_attention.cu")).read()
src = re.sub(r'#include [<"][^\n]*\n', "", src)
begin, end = src.index("// ---- PTX wrappers"), src.index("// ---- tiles in shared memory")
src = src[:begin] + open(os.path.join(here, "wrappers.h")).read() + src[end:]
src = src[: src.index("// ---- host side")] + "}  // namespace\n}  // namespace kt::kernels::cuda\n"
shared = "extern __shared__ __align__(16) unsigned char shared_raw[];"
if shared not in src:
    sys.exit("extract.py: the kernels' shared-memory declaration changed; update extract.py")
src = src.replace(shared, "unsigned char* shared_raw = sim::block_shared();")
open(sys.argv[1], "w").write('#include "prelude.h"\n' + src)
